"""Every diagnosis label, from the numbers that should produce it; thresholds are configurable."""

from __future__ import annotations

import pytest

from tests.summary.builders import record, summary_doc
from traceml_ci.summary.build import build_summary
from traceml_ci.summary.thresholds import Thresholds


@pytest.mark.parametrize(
    ("phases", "other", "label"),
    [
        ({"dataloader": 6, "forward": 2, "backward": 2, "optimizer": 0.5}, 0.5, "INPUT_BOUND"),
        ({"dataloader": 0.2, "forward": 4, "backward": 5, "optimizer": 0.5}, 0.3, "COMPUTE_BOUND"),
        ({"dataloader": 0.2, "forward": 1, "backward": 1, "optimizer": 3}, 0.3, "OPTIMIZER_BOUND"),
        ({"dataloader": 0.2, "forward": 1, "backward": 1, "optimizer": 0.3}, 2.0, "OVERHEAD_BOUND"),
        ({"dataloader": 2, "forward": 2, "backward": 2.5, "optimizer": 2}, 1.5, "BALANCED"),
    ],
)
def test_step_time_labels(phases, other, label) -> None:
    doc = summary_doc(phases, other_ms=other)
    assert doc["step_time"]["diagnosis"] == label
    primary = doc["diagnoses"][0]
    assert primary["area"] == "step_time" and primary["kind"] == label
    assert primary["next_step"]


def test_insufficient_data() -> None:
    doc = summary_doc({"forward": 1.0}, steps=4)
    assert doc["step_time"]["diagnosis"] == "INSUFFICIENT_DATA"
    assert "at least 10 steps" in doc["diagnoses"][0]["next_step"]


@pytest.mark.parametrize(
    ("warmup", "said"),
    [(0, "at least 10 steps."), (1, "at least 10 steps after the 1 warmup step."),
     (5, "at least 10 steps after the 5 warmup steps.")],
)
def test_insufficient_data_says_the_warmup_properly(warmup: int, said: str) -> None:
    from traceml_ci.summary.diagnose import diagnose_step_time
    from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS

    pct = {"dataloader": 10.0, "forward": 40.0, "backward": 40.0, "optimizer": 5.0, "other": 5.0}
    (d,) = diagnose_step_time(pct, 4, warmup, DEFAULT_THRESHOLDS, dataloader=None, device="cpu")
    assert d.kind == "INSUFFICIENT_DATA" and d.next_step.endswith(said), d.next_step
    assert "0 warmup" not in d.next_step + d.message


def test_input_bound_next_step_points_at_the_dataloader() -> None:
    doc = summary_doc({"dataloader": 9, "forward": 1}, other_ms=0.1)
    nxt = doc["diagnoses"][0]["next_step"]
    assert "num_workers" in nxt and "__getitem__" in nxt
    assert "pin_memory" not in nxt  # a CPU run: pinned memory cannot help (more: tests/tracer)
    assert doc["diagnoses"][0]["severity"] == "crit"


def test_several_labels_listed_primary_first() -> None:
    doc = summary_doc({"dataloader": 4, "forward": 2.5, "backward": 3}, other_ms=0.0)
    kinds = [d["kind"] for d in doc["diagnoses"] if d["area"] == "step_time"]
    assert kinds == ["INPUT_BOUND"]
    doc = summary_doc({"dataloader": 3.5, "forward": 3, "backward": 3.5}, other_ms=0.0)
    kinds = [d["kind"] for d in doc["diagnoses"] if d["area"] == "step_time"]
    assert kinds == ["INPUT_BOUND", "COMPUTE_BOUND"]


def test_thresholds_are_configurable() -> None:
    phases = {"dataloader": 2.5, "forward": 3.5, "backward": 3.5, "optimizer": 0.5}
    assert summary_doc(phases)["step_time"]["diagnosis"] == "COMPUTE_BOUND"
    strict = Thresholds(input_bound_pct=20.0)
    assert summary_doc(phases, strict)["step_time"]["diagnosis"] == "INPUT_BOUND"


def _mem_doc(**overrides):
    return build_summary(record({"forward": 1.0, "backward": 1.0}, **overrides)).to_dict()


def test_memory_no_data_and_balanced() -> None:
    assert _mem_doc()["step_memory"]["diagnosis"] == "NO_DATA"
    flat = [(i, 300.0) for i in range(6, 56)]
    doc = _mem_doc(rss_samples=flat, peak_rss_mb=300.0, system_total_mb=24_000.0)
    assert doc["step_memory"]["diagnosis"] == "BALANCED"
    assert doc["step_memory"]["growth_mb_per_1k_steps"] == 0.0


def test_memory_growth_on_rss() -> None:
    growing = [(i, 300.0 + 4.0 * i) for i in range(6, 56)]  # +200 MB over the run
    doc = _mem_doc(rss_samples=growing, peak_rss_mb=520.0, system_total_mb=24_000.0)
    mem = doc["step_memory"]
    assert mem["diagnosis"] == "MEMORY_GROWTH" and mem["growth_basis"] == "rss"
    assert mem["growth_mb_per_1k_steps"] == pytest.approx(4000.0)


def test_memory_high_pressure_from_fraction_and_from_ooms() -> None:
    flat = [(i, 23_000.0) for i in range(6, 56)]
    doc = _mem_doc(rss_samples=flat, peak_rss_mb=23_000.0, system_total_mb=24_000.0)
    assert doc["step_memory"]["diagnosis"] == "HIGH_PRESSURE"
    flat = [(i, 300.0) for i in range(6, 56)]
    doc = _mem_doc(rss_samples=flat, peak_rss_mb=300.0, system_total_mb=24_000.0, ooms=1)
    assert doc["step_memory"]["diagnosis"] == "HIGH_PRESSURE"


def test_memory_fragmentation_on_device() -> None:
    from traceml_ci.summary.build import StepSeries

    rec = record({"forward": 1.0}, steps=30)
    rec.series = StepSeries(
        step_ms=rec.series.step_ms,
        phase_ms=rec.series.phase_ms,
        allocated_mb=[2000.0] * 30,
        reserved_mb=[6000.0] * 30,
    )
    rec.device_total_mb = 80_000.0
    doc = build_summary(rec).to_dict()
    assert doc["step_memory"]["diagnosis"] == "FRAGMENTATION"
    assert doc["step_memory"]["peak_reserved_mb"] == 6000.0
