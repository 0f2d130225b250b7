"""SummaryView: every accessor on real summaries (checked against the raw JSON, read
independently), and on malformed ones -- missing, NaN, infinite, wrong types -- where each reads
as None (or its documented empty value) and never raises."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from traceml_ci.summary.keys import PHASES, PHASES_WITH_WAIT
from traceml_ci.summary.view import SummaryView, as_view, finite

DATA = Path(__file__).resolve().parents[1] / "gate" / "data"
REAL = sorted(p.stem for p in DATA.glob("*.json"))
STATS = ("median", "p10", "p90", "mean")
MEMORY_KEYS = ("peak_allocated_mb", "peak_reserved_mb", "peak_rss_mb", "peak_job_rss_mb")


def _real(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def _raw(doc: Any, *path: str) -> Any:
    """The value at ``path`` by plain indexing, None where a key is absent: the independent
    reading each accessor is checked against."""
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


#: Each accessor, and what it reads as when its value is absent or unusable.
ACCESSORS: dict[str, tuple[Callable[[SummaryView], Any], Any]] = {
    "run_name": (lambda v: v.run_name, ""),
    "run_status": (lambda v: v.run_status, None),
    "world_size": (lambda v: v.world_size, 1),
    "runqueue_wait_pct": (lambda v: v.runqueue_wait_pct, None),
    "repeats_count": (lambda v: v.repeats_count, None),
    "share": (lambda v: [v.share(p) for p in PHASES], [None] * len(PHASES)),
    "shares": (lambda v: v.shares(), dict.fromkeys(PHASES)),
    "phases": (lambda v: v.phases, PHASES),
    "share_noise": (lambda v: [v.share_noise(p) for p in PHASES], [None] * len(PHASES)),
    "step_ms": (lambda v: [v.step_ms(s) for s in STATS], [None] * len(STATS)),
    "step_noise_ms": (lambda v: v.step_noise_ms, None),
    "phase_ms": (lambda v: [v.phase_ms(p) for p in PHASES], [None] * len(PHASES)),
    "steps_analyzed": (lambda v: v.steps_analyzed, None),
    "steps_total": (lambda v: v.steps_total, None),
    "warmup_steps": (lambda v: v.warmup_steps, None),
    "recovered": (lambda v: v.recovered, False),
    "clock": (lambda v: v.clock, None),
    "host_clock": (lambda v: v.host_clock, True),
    "steps_per_s": (lambda v: v.steps_per_s, None),
    "samples_per_s": (lambda v: v.samples_per_s, None),
    "label": (lambda v: [v.label("step_time"), v.label("step_memory")], [None, None]),
    "memory_mb": (lambda v: [v.memory_mb(k) for k in MEMORY_KEYS], [None] * len(MEMORY_KEYS)),
    "memory_device": (lambda v: v.memory_device, None),
    "growth_mb_per_1k_steps": (lambda v: v.growth_mb_per_1k_steps, None),
    "growth_basis": (lambda v: v.growth_basis, None),
    "diagnoses": (lambda v: v.diagnoses, []),
    "number": (lambda v: v.number(("step_time", "step_ms", "median")), None),
    "text": (lambda v: v.text(("run", "name")), None),
}
#: Accessors that read text (a string of any content is theirs to hand back).
TEXT_ACCESSORS = (
    "run_name",
    "run_status",
    "clock",
    "host_clock",
    "label",
    "memory_device",
    "growth_basis",
    "text",
)
#: Accessors that hand back a whole block: empty when the block is not an object.
SECTIONS = ("run", "env", "step_time", "step_memory", "efficiency", "counters")
#: Whether a block is there at all (a block of poisoned values is still a block).
PRESENCE: dict[str, tuple[Callable[[SummaryView], Any], Any]] = {
    "has_noise": (lambda v: v.has_noise, False),
    "mapped_from": (lambda v: v.mapped_from, None),
}


def test_the_wait_phase_is_a_phase_only_where_the_summary_has_it() -> None:
    doc = _real(REAL[0])
    assert SummaryView(doc).phases == PHASES and "wait" not in SummaryView(doc).shares()
    st = doc["step_time"]
    st["wait_pct"], st["backward_pct"] = 5.0, st["backward_pct"] - 5.0
    v = SummaryView(doc)
    assert v.phases == PHASES_WITH_WAIT and v.shares()["wait"] == 5.0
    assert math.isclose(sum(v.shares().values()), 100.0, abs_tol=0.1)


def test_every_public_accessor_is_covered_here() -> None:
    """A property added to SummaryView without a test here fails this one."""
    public = {n for n in dir(SummaryView) if not n.startswith("_")}
    covered = set(ACCESSORS) | set(SECTIONS) | set(PRESENCE) | {"doc", "at"}
    assert public == covered


# -- a real summary -------------------------------------------------------------------------


@pytest.mark.parametrize("name", REAL)
def test_every_accessor_reads_what_the_json_holds(name: str) -> None:
    doc = _real(name)
    v = SummaryView(doc)
    st, sm = doc["step_time"], doc["step_memory"]
    for section in SECTIONS:
        assert getattr(v, section) == doc.get(section, {})
    assert v.run_name == doc["run"]["name"] and v.run_name
    assert v.run_status == doc["run"]["status"] == "completed"
    assert v.world_size == doc["run"]["world_size"]
    assert v.runqueue_wait_pct == _raw(doc, "run", "contention", "runqueue_wait_pct")
    assert v.repeats_count is None and v.mapped_from is None and not v.recovered
    for p in PHASES:
        assert v.share(p) == st[f"{p}_pct"] == v.shares()[p]
        assert v.share_noise(p) == st["noise"]["pct"][p]["iqr"]
        assert v.phase_ms(p) == st["phase_ms"][p]
    assert math.isclose(sum(v.shares().values()), 100.0, abs_tol=0.1)
    for stat in STATS:
        assert v.step_ms(stat) == st["step_ms"][stat]
    assert v.step_ms() == st["step_ms"]["median"] == v.number(("step_time", "step_ms", "median"))
    assert v.step_noise_ms == st["noise"]["step_ms"]["iqr"] and v.has_noise
    assert (v.steps_analyzed, v.steps_total, v.warmup_steps) == (
        st["steps_analyzed"],
        st["steps_total"],
        st["warmup_steps"],
    )
    assert v.steps_analyzed + v.warmup_steps <= v.steps_total
    assert v.clock == st["clock"] and v.host_clock is (st["clock"] != "device_event")
    assert v.steps_per_s == st["throughput"]["steps_per_s"]
    assert v.samples_per_s == st["throughput"]["samples_per_s"]
    assert v.label("step_time") == st["diagnosis"] == v.text(("step_time", "diagnosis"))
    assert v.label("step_memory") == sm["diagnosis"]
    for key in MEMORY_KEYS:
        assert v.memory_mb(key) == sm.get(key)  # null in the JSON (a CPU run) reads as None
    assert v.memory_device == sm["device"]
    assert v.growth_mb_per_1k_steps == sm["growth_mb_per_1k_steps"]
    assert v.growth_basis == sm["growth_basis"]
    assert v.diagnoses == doc["diagnoses"] and v.diagnoses
    assert v.at(("env", "torch")) == doc["env"]["torch"]
    assert v.at(("env", "torch", "deeper")) is None and v.at(("nope",)) is None
    assert v.doc is doc


@pytest.mark.parametrize("name", REAL)
def test_viewing_leaves_the_summary_as_it_was(name: str) -> None:
    doc = _real(name)
    before = copy.deepcopy(doc)
    v = SummaryView(doc)
    for read, _ in (*ACCESSORS.values(), *PRESENCE.values()):
        read(v)
    assert doc == before


def test_as_view_reuses_a_view_and_wraps_a_dict() -> None:
    doc = _real(REAL[0])
    v = SummaryView(doc)
    assert as_view(v) is v
    assert isinstance(as_view(doc), SummaryView) and as_view(doc).doc is doc


# -- the blocks and counts that are read with a rule ---------------------------------------


def test_world_size_prefers_the_distributed_block_then_run_then_one() -> None:
    doc = _real(REAL[0])
    doc["run"]["world_size"] = 3
    assert SummaryView(doc).world_size == 3
    doc["distributed"] = {"world_size": 4}
    assert SummaryView(doc).world_size == 4
    doc["distributed"] = {"world_size": 0}  # not a world: the next source
    assert SummaryView(doc).world_size == 3
    del doc["run"]["world_size"]
    assert SummaryView(doc).world_size == 1


@pytest.mark.parametrize(
    ("wait", "read"),
    [
        (0.0, 0.0),
        (37.5, 37.5),
        (99.9, 99.9),
        (100.0, None),
        (-1.0, None),
        (math.nan, None),
        (True, None),
        ("40", None),
    ],
)
def test_runqueue_wait_is_a_percentage_below_100(wait: Any, read: float | None) -> None:
    doc = _real(REAL[0])
    doc["run"]["contention"] = {"runqueue_wait_pct": wait}
    assert SummaryView(doc).runqueue_wait_pct == read


def test_combined_mapped_and_recovered_summaries_say_so() -> None:
    doc = _real(REAL[0])
    doc["repeats"] = {"count": 3}
    doc["mapped_from"] = {"tool": "traceml-ai", "unmapped": ["gpu"]}
    doc["run"]["recovered_from"] = "live_snapshot"
    v = SummaryView(doc)
    assert v.repeats_count == 3 and v.recovered
    assert v.mapped_from is doc["mapped_from"]


def test_a_negative_spread_is_not_a_spread() -> None:
    doc = _real(REAL[0])
    doc["step_time"]["noise"]["pct"]["forward"]["iqr"] = -0.5
    doc["step_time"]["noise"]["step_ms"]["iqr"] = -1.0
    v = SummaryView(doc)
    assert v.share_noise("forward") is None and v.step_noise_ms is None
    assert v.share_noise("backward") == doc["step_time"]["noise"]["pct"]["backward"]["iqr"]


def test_diagnoses_keep_only_objects() -> None:
    doc = _real(REAL[0])
    kept = doc["diagnoses"][0]
    doc["diagnoses"] = [kept, "COMPUTE_BOUND", None, 3]
    assert SummaryView(doc).diagnoses == [kept]


@pytest.mark.parametrize(
    ("x", "read"),
    [
        (1, 1.0),
        (2.5, 2.5),
        (-0.0, 0.0),
        (True, None),
        (False, None),
        ("1", None),
        (None, None),
        (math.nan, None),
        (math.inf, None),
        (-math.inf, None),
        ([1.0], None),
    ],
    ids=repr,
)
def test_finite(x: Any, read: float | None) -> None:
    assert finite(x) == read
    assert read is None or type(finite(x)) is float


# -- malformed summaries: None, never an exception -----------------------------------------


def _with_every_block(doc: dict[str, Any]) -> dict[str, Any]:
    """The real summary with the optional blocks present too, so poisoning reaches them."""
    doc = copy.deepcopy(doc)
    doc["run"]["contention"] = {"runqueue_wait_pct": 12.0}
    doc["run"]["recovered_from"] = "live_snapshot"
    doc["repeats"] = {"count": 3}
    doc["distributed"] = {"world_size": 2}
    doc["efficiency"] = {"flops_per_step": 1e9}
    doc["counters"] = {"syncs": {"per_step": 1}}
    return doc


def _poison(node: Any, bad: Any) -> Any:
    """Every leaf (anything but an object) replaced by ``bad``; the objects kept."""
    if isinstance(node, Mapping):
        return {k: _poison(v, bad) for k, v in node.items()}
    return copy.deepcopy(bad)


BAD_LEAVES = [math.nan, math.inf, -math.inf, True, False, None, [], [1.0], {}]
BAD_BLOCKS = [None, [], [[1]], "step_time", 3, math.nan, True]


@pytest.mark.parametrize("bad", BAD_LEAVES, ids=repr)
def test_every_leaf_unusable_reads_as_absent(bad: Any) -> None:
    doc = _poison(_with_every_block(_real(REAL[0])), bad)
    v = SummaryView(doc)
    for name, (read, absent) in ACCESSORS.items():
        assert read(v) == absent, name
    for section in SECTIONS:  # the blocks are still objects: handed back as they are
        assert getattr(v, section) is doc[section]


@pytest.mark.parametrize("bad", ["12.5", "", "live_snapshot!"], ids=repr)
def test_numbers_given_as_text_read_as_absent(bad: str) -> None:
    doc = _poison(_with_every_block(_real(REAL[0])), bad)
    v = SummaryView(doc)
    for name, (read, absent) in ACCESSORS.items():
        if name in TEXT_ACCESSORS:
            continue
        assert read(v) == absent, name
    assert v.run_name == bad and v.label("step_time") == bad  # text is text, whatever it says


@pytest.mark.parametrize("bad", BAD_BLOCKS, ids=repr)
def test_every_block_of_the_wrong_type_reads_as_empty(bad: Any) -> None:
    doc = {k: copy.deepcopy(bad) for k in _with_every_block(_real(REAL[0]))}
    doc["mapped_from"] = copy.deepcopy(bad)
    v = SummaryView(doc)
    for name, (read, absent) in {**ACCESSORS, **PRESENCE}.items():
        assert read(v) == absent, name
    for section in SECTIONS:
        assert getattr(v, section) == {}


def test_an_empty_summary_reads_as_absent_everywhere() -> None:
    v = SummaryView({})
    for name, (read, absent) in {**ACCESSORS, **PRESENCE}.items():
        assert read(v) == absent, name
    assert v.at(("run", "name")) is None
