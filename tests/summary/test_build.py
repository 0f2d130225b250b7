"""Building the summary: percentages, robust statistics, noise windows, size, schema."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.summary.builders import record, summary_doc
from traceml_ci.summary.build import StepSeries, build_summary
from traceml_ci.summary.io import summary_text
from traceml_ci.summary.schema import summary_problems

PHASES = ("dataloader", "forward", "backward", "optimizer", "other")


def test_seed_keys_are_verbatim() -> None:
    doc = summary_doc({"dataloader": 4.7, "forward": 3.1, "backward": 1.8, "optimizer": 0.4})
    assert isinstance(doc["step_time"]["diagnosis"], str)
    assert doc["step_time"]["diagnosis"] == "INPUT_BOUND"
    for key in ("dataloader_pct", "forward_pct", "backward_pct", "optimizer_pct"):
        assert isinstance(doc["step_time"][key], float)
    assert doc["step_time"]["dataloader_pct"] == 47.0
    assert isinstance(doc["step_memory"]["diagnosis"], str)


def test_percentages_and_other() -> None:
    doc = summary_doc({"dataloader": 2, "forward": 3, "backward": 4, "optimizer": 1}, other_ms=10)
    st_ = doc["step_time"]
    assert [st_[f"{p}_pct"] for p in PHASES] == [10.0, 15.0, 20.0, 5.0, 50.0]
    assert st_["phase_ms"]["other"] == 10.0
    assert st_["step_ms"]["median"] == 20.0
    assert st_["throughput"]["steps_per_s"] == 50.0


def test_a_run_with_a_process_group_has_the_wait_phase_and_only_such_a_run() -> None:
    ms = {"dataloader": 2, "forward": 3, "backward": 4, "optimizer": 1, "wait": 6}
    doc = summary_doc(ms, other_ms=4, waits=True)
    st_ = doc["step_time"]
    phases = ("dataloader", "forward", "backward", "wait", "optimizer", "other")
    assert [st_[f"{p}_pct"] for p in phases] == [10.0, 15.0, 20.0, 30.0, 5.0, 20.0]
    assert st_["phase_ms"]["wait"] == 6.0 and st_["phase_ms"]["other"] == 4.0
    assert set(st_["noise"]["pct"]) == set(phases)
    assert summary_problems(doc) == []
    # Waiting is not compute: 30 % wait + 35 % compute is no COMPUTE_BOUND.
    assert st_["diagnosis"] != "COMPUTE_BOUND"
    # Without a process group: no wait key anywhere, whatever the columns hold.
    single = summary_doc(ms, other_ms=4)["step_time"]
    assert "wait_pct" not in single and "wait" not in single["phase_ms"]
    assert "wait" not in single["noise"]["pct"]
    assert summary_problems(summary_doc(ms, other_ms=4)) == []


def test_rare_extreme_steps_do_not_move_the_percentages() -> None:
    rec = record({"dataloader": 1, "forward": 3, "backward": 4, "optimizer": 1}, other_ms=1)
    steps = list(rec.series.step_ms)
    dl = list(rec.series.phase_ms["dataloader"])
    steps[20] += 2000.0  # a checkpoint save inside one step's dataloader wait
    dl[20] += 2000.0
    rec.series = StepSeries(step_ms=steps, phase_ms={**rec.series.phase_ms, "dataloader": dl})
    doc = build_summary(rec).to_dict()
    assert doc["step_time"]["dataloader_pct"] == 10.0
    assert doc["step_time"]["outlier_steps"] == 1
    assert doc["step_time"]["step_ms"]["mean"] > 40  # the mean (throughput) still sees it


def test_noise_windows_report_median_and_iqr() -> None:
    doc = summary_doc({"dataloader": 5, "forward": 5}, steps=100, jitter=0.0)
    noise = doc["step_time"]["noise"]
    assert noise["windows"] == 10 and noise["window_steps"] == 10
    assert noise["pct"]["dataloader"] == {"median": 50.0, "iqr": 0.0}
    assert summary_doc({"forward": 1}, steps=9)["step_time"]["noise"] is None


def test_sampled_long_runs_scale_counts_by_stride() -> None:
    rec = record({"forward": 1.0, "backward": 1.0}, steps=50)
    rec.series.stride = 4
    doc = build_summary(rec).to_dict()
    assert doc["step_time"]["steps_analyzed"] == 200


def test_summary_is_small_and_valid() -> None:
    doc = summary_doc(
        {"dataloader": 4.7, "forward": 3.1, "backward": 1.8, "optimizer": 0.4},
        rss_samples=[(i, 300.0 + i) for i in range(100)],
        peak_rss_mb=400.0,
    )
    assert summary_problems(doc) == []
    assert len(summary_text(doc).encode()) <= 8 * 1024


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(*[st.floats(min_value=0, max_value=1e4, allow_nan=False)] * 5),
        min_size=0,
        max_size=80,
    )
)
def test_any_series_gives_a_valid_summary_whose_pcts_add_to_100(rows) -> None:
    phases = ("dataloader", "forward", "backward", "optimizer")
    series = StepSeries(
        step_ms=[sum(r[:4]) + r[4] for r in rows],
        phase_ms={p: [r[i] for r in rows] for i, p in enumerate(phases)},
    )
    rec = record({"forward": 1.0})
    rec.series = series
    doc = build_summary(rec).to_dict()
    assert summary_problems(doc) == []
    values = [doc["step_time"][f"{p}_pct"] for p in PHASES]
    if rows:
        assert sum(values) == pytest.approx(100.0, abs=0.1)
    else:
        assert values == [None] * 5
