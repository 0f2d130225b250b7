"""Build summary dicts for gate tests from a real one, by phase milliseconds."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from traceml_ci.summary.keys import PHASES, WAIT_PHASE, phases_of

__all__ = ["BASE_MS", "DATA", "GOLDEN", "PHASES", "TRACEML_AI", "make", "real", "shift"]

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "golden"
TRACEML_AI = Path(__file__).resolve().parents[1] / "data" / "traceml-ai-0.5.0"

#: A plain balanced-ish split, in ms per step: 20 ms in all.
BASE_MS = {"dataloader": 4.0, "forward": 6.0, "backward": 8.0, "optimizer": 1.0, "other": 1.0}


def real(name: str = "input_bound_a") -> dict[str, Any]:
    """A summary the tracer wrote for one of the examples (tests/gate/data/<name>.json)."""
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def make(
    ms: dict[str, float] | None = None,
    *,
    iqr_pp: float | None = 0.3,
    step_iqr_ms: float | None = 0.2,
    rss_mb: float = 300.0,
    diagnosis: str | None = None,
    name: str = "run",
    clock: str = "device_event",
    cpu_ms: float | None = None,
    **env: Any,
) -> dict[str, Any]:
    """A valid summary whose step splits into ``ms`` (phase -> median ms; with the wait phase,
    as a run under a process group, where ``ms`` has it). ``iqr_pp``: the
    per-window IQR of every pct (None: no noise block). Diagnosis: derived with the tracer's
    own rules unless given.

    ``clock``: timed with device events by default, where timings decide under the tolerance
    and noise rules these tests check; ``"host"`` for a CPU runner's summary, where timings
    only inform (docs/gate.md, "The rule"). ``cpu_ms``: a host-clock run's CPU time per step
    (default: the step's median, as a one-thread job spends it)."""
    from traceml_ci.summary.diagnose import diagnose_step_time
    from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS

    ms = dict(BASE_MS if ms is None else ms)
    doc = copy.deepcopy(real())
    phases = phases_of(WAIT_PHASE in ms)
    step = sum(ms.values())
    pct = {p: round(ms[p] / step * 100.0, 2) for p in phases}
    pct["other"] = round(100.0 - sum(pct[p] for p in phases if p != "other"), 2)
    st = doc["step_time"]
    for p in phases:
        st[f"{p}_pct"] = pct[p]
        st["phase_ms"][p] = ms[p]
    st["step_ms"] = {"median": step, "p10": step * 0.95, "p90": step * 1.05, "mean": step}
    st["throughput"] = {"steps_per_s": 1000.0 / step, "samples_per_s": 16000.0 / step,
                        "batch_size": 16}
    if iqr_pp is None:
        st["noise"] = None
    else:
        st["noise"] = {
            "windows": 10, "window_steps": 14,
            "pct": {p: {"median": pct[p], "iqr": iqr_pp} for p in phases},
            "step_ms": {"median": step, "iqr": step_iqr_ms or 0.0},
        }
    st["diagnosis"] = diagnosis or diagnose_step_time(
        pct, st["steps_analyzed"], st["warmup_steps"], DEFAULT_THRESHOLDS
    )[0].kind
    doc["step_memory"]["peak_rss_mb"] = rss_mb
    doc["run"]["name"] = name
    doc["env"].update(env)
    st["clock"] = "device_event" if doc["env"]["device_type"] != "cpu" else clock
    if st["clock"] == "host":
        st["cpu_ms"] = step if cpu_ms is None else cpu_ms
    else:
        st.pop("cpu_ms", None)
    return doc


def shift(ms: dict[str, float] | None = None, **extra_ms: float) -> dict[str, float]:
    """BASE_MS (or ``ms``) with milliseconds added per phase: ``shift(dataloader=3.0)``."""
    out = dict(BASE_MS if ms is None else ms)
    for phase, add in extra_ms.items():
        out[phase] += add
    return out
