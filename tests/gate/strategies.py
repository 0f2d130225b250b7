"""Hypothesis strategies: valid summaries with arbitrary figures, and arbitrary JSON."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from tests.gate.summaries import PHASES, real

STEP_LABELS = ["INPUT_BOUND", "COMPUTE_BOUND", "OPTIMIZER_BOUND", "OVERHEAD_BOUND", "BALANCED",
               "INSUFFICIENT_DATA"]
MEMORY_LABELS = ["BALANCED", "MEMORY_GROWTH", "HIGH_PRESSURE", "FRAGMENTATION", "NO_DATA"]

ms = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
maybe_ms = st.none() | ms
mb = st.none() | st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)
iqr = st.floats(min_value=0.0, max_value=100.0, allow_nan=False, allow_infinity=False)


@st.composite
def pcts(draw: st.DrawFn) -> dict[str, float]:
    weights = draw(st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
                            min_size=5, max_size=5))
    total = sum(weights)
    if total == 0:
        weights, total = [1.0, 0, 0, 0, 0], 1.0
    out = {p: round(w / total * 100.0, 2) for p, w in zip(PHASES, weights, strict=True)}
    out["other"] = round(max(100.0 - sum(out[p] for p in PHASES[:-1]), 0.0), 2)
    return out


@st.composite
def summaries(draw: st.DrawFn) -> dict[str, Any]:
    """A schema-valid summary with arbitrary shares, times, memory, labels, noise and env."""
    doc = copy.deepcopy(real())
    s = doc["step_time"]
    share = draw(pcts() | st.just(dict.fromkeys(PHASES)))
    if share["other"] is None:  # shares are null only when no step was analysed (the schema)
        s["steps_analyzed"] = 0
    for p in PHASES:
        s[f"{p}_pct"] = share[p]
        s["phase_ms"][p] = draw(maybe_ms)
    s["diagnosis"] = draw(st.sampled_from(STEP_LABELS))
    s["step_ms"] = {k: draw(maybe_ms) for k in ("median", "p10", "p90", "mean")}
    s["throughput"]["samples_per_s"] = draw(maybe_ms)
    if draw(st.booleans()) or share["other"] is None:
        s["noise"] = None
    else:
        s["noise"] = {
            "windows": 10, "window_steps": 5,
            "pct": {p: {"median": share[p], "iqr": draw(iqr)} for p in PHASES},
            "step_ms": {"median": 1.0, "iqr": draw(iqr)},
        }
    m = doc["step_memory"]
    m["diagnosis"] = draw(st.sampled_from(MEMORY_LABELS))
    for key in ("peak_allocated_mb", "peak_reserved_mb", "peak_rss_mb"):
        m[key] = draw(mb)
    m["growth_mb_per_1k_steps"] = draw(st.none() | st.floats(-1e6, 1e6, allow_nan=False))
    doc["env"]["device_type"] = draw(st.sampled_from(["cpu", "cuda", "mps"]))
    doc["env"]["device_name"] = draw(st.none() | st.text(max_size=12))
    doc["env"]["torch"] = draw(st.none() | st.sampled_from(["2.4.0", "2.6.0+cpu", "3.0", "x"]))
    doc["run"]["name"] = draw(st.text(max_size=20))
    doc["run"]["status"] = draw(st.sampled_from(["completed", "crashed", "interrupted"]))
    return doc


json_scalars = (st.none() | st.booleans() | st.integers(-10**6, 10**6)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)


def paths_of(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value in a JSON document."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths_of(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths_of(v, (*prefix, i))
    return out


def set_path(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@st.composite
def mutated_summaries(draw: st.DrawFn) -> Any:
    """A real summary with one to three values replaced (or removed) at random."""
    doc = copy.deepcopy(real())
    for _ in range(draw(st.integers(1, 3))):
        paths = paths_of(doc)
        path = draw(st.sampled_from(paths))
        if path and draw(st.booleans()) and isinstance(doc, dict):
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, dict):
                del parent[path[-1]]
                continue
        doc = set_path(doc, path, draw(json_values))
    return doc
