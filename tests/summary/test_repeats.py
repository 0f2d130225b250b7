"""Repeated runs combined: means of shares, the runs' spread as noise, a valid summary."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gate.strategies import summaries
from tests.gate.summaries import PHASES, make
from traceml_ci.gate import DEFAULT_RULES, compare
from traceml_ci.summary.repeats import IQR_PER_SD, combine_repeats
from traceml_ci.summary.schema import summary_problems


def runs(*dataloader_ms: float) -> list[dict]:
    """Runs of one job whose dataloader takes these ms per step (the rest: 16 ms)."""
    return [
        make({"dataloader": d, "forward": 6.0, "backward": 8.0, "optimizer": 1.0, "other": 1.0},
             name=f"run-{i}")
        for i, d in enumerate(dataloader_ms)
    ]


def shares(doc: dict) -> dict[str, float]:
    return {p: doc["step_time"][f"{p}_pct"] for p in PHASES}


def test_one_run_comes_back_unchanged_and_is_a_copy() -> None:
    (doc,) = runs(4.0)
    out = combine_repeats([doc])
    assert out == doc and out is not doc
    out["step_time"]["dataloader_pct"] = 0.0
    assert doc["step_time"]["dataloader_pct"] != 0.0


def test_shares_are_means_that_still_add_up_to_100_and_the_result_validates() -> None:
    docs = runs(3.0, 4.0, 9.0)
    out = combine_repeats(docs)
    assert summary_problems(out) == []
    assert abs(sum(shares(out).values()) - 100.0) <= 0.1
    for p in PHASES:
        mean = sum(d["step_time"][f"{p}_pct"] for d in docs) / 3
        assert out["step_time"][f"{p}_pct"] == pytest.approx(mean, abs=0.02)
    assert out["repeats"]["count"] == 3
    assert out["repeats"]["runs"] == ["run-0", "run-1", "run-2"]
    assert out["repeats"]["step_time"] == [d["step_time"] for d in docs]
    # Times: the median over the runs, here the middle run's.
    assert out["step_time"]["step_ms"]["median"] == docs[1]["step_time"]["step_ms"]["median"]


def test_noise_is_the_spread_across_runs_when_it_exceeds_the_windows() -> None:
    steady = combine_repeats(runs(4.0, 4.0, 4.0))
    noisy_docs = runs(2.0, 4.0, 8.0)
    noisy = combine_repeats(noisy_docs)
    window_iqr = noisy_docs[0]["step_time"]["noise"]["pct"]["dataloader"]["iqr"]
    assert steady["step_time"]["noise"]["pct"]["dataloader"]["iqr"] == window_iqr
    values = [d["step_time"]["dataloader_pct"] for d in noisy_docs]
    import statistics

    expected = IQR_PER_SD * statistics.stdev(values) / 3**0.5
    got = noisy["step_time"]["noise"]["pct"]["dataloader"]["iqr"]
    assert got == pytest.approx(expected, abs=0.01) and got > window_iqr


def test_one_slow_run_of_three_does_not_fail_the_gate_but_two_do() -> None:
    base = combine_repeats(runs(4.0, 4.0, 4.0))
    # one run at +18 pp moves the mean +6 pp, past the tolerance, but widens the noise more
    assert compare(base, combine_repeats(runs(4.0, 4.0, 10.0)), DEFAULT_RULES).verdict.value in (
        "pass", "warn")
    assert compare(base, combine_repeats(runs(4.0, 10.0, 10.0)), DEFAULT_RULES).verdict.value == (
        "regression")


def test_no_spread_across_runs_widens_the_allowance_past_the_noise_cap() -> None:
    # One run at +45 pp moves the mean +15 pp: its spread (20 pp) is past the cap (2 x 5 pp).
    base = combine_repeats(runs(4.0, 4.0, 4.0))
    assert compare(base, combine_repeats(runs(4.0, 4.0, 30.0)), DEFAULT_RULES).verdict.value == (
        "regression")


def test_runs_that_disagree_widen_the_noise_margin() -> None:
    base = combine_repeats(runs(4.0, 4.0, 4.0))
    steady_head = combine_repeats(runs(6.5, 6.5, 6.5))  # +~8 pp, all three agree
    shaky_head = combine_repeats(runs(1.0, 6.5, 14.0))  # runs all over the place
    assert compare(base, steady_head, DEFAULT_RULES).verdict.value == "regression"
    assert compare(base, shaky_head, DEFAULT_RULES).verdict.value != "regression"


def test_no_runs_is_an_error() -> None:
    with pytest.raises(ValueError):
        combine_repeats([])


@settings(max_examples=60, deadline=None)
@given(st.lists(summaries(), min_size=2, max_size=5))
def test_any_valid_runs_combine_into_a_valid_summary(docs: list[dict]) -> None:
    before = copy.deepcopy(docs)
    out = combine_repeats(docs)
    assert summary_problems(out) == []
    assert docs == before  # the inputs are left alone
    assert out["repeats"]["count"] == len(docs)


def test_memory_peaks_are_the_largest_runs() -> None:
    """Runs in one process reuse the first run's memory: the combination keeps the largest
    peak (a median would compare a warm re-run with the other side's cold run)."""
    from tests.gate.summaries import make

    docs = [make(rss_mb=mb) for mb in (400.0, 310.0, 305.0)]
    for doc, job in zip(docs, (90.0, 4.0, 5.0), strict=True):
        doc["step_memory"]["peak_job_rss_mb"] = job
    out = combine_repeats(docs)
    assert out["step_memory"]["peak_rss_mb"] == 400.0
    assert out["step_memory"]["peak_job_rss_mb"] == 90.0
    assert combine_repeats([out, make(rss_mb=300.0)])["step_memory"]["peak_rss_mb"] == 400.0


def test_cpu_per_step_is_the_runs_median_and_absent_unless_every_run_has_it() -> None:
    docs = runs(3.0, 4.0, 9.0)
    for doc, cpu in zip(docs, (7.0, 30.0, 6.5), strict=True):  # the middle run's is not it
        doc["step_time"]["cpu_ms"] = cpu
    out = combine_repeats(docs)
    assert out["step_time"]["cpu_ms"] == 7.0 and summary_problems(out) == []
    del docs[2]["step_time"]["cpu_ms"]  # one run without it (a device-clock run)
    assert "cpu_ms" not in combine_repeats(docs)["step_time"]


def test_figures_older_summaries_have_and_nothing_reads_are_dropped_when_combined() -> None:
    """A/B's CPU reference and its uncontended windows (removed): older baselines still
    validate with them, and a combined summary drops them rather than let one run's figure
    stand for all."""
    docs = runs(3.0, 4.0, 9.0)
    for doc in docs:
        doc["step_time"]["cpu_reference_ms"] = 0.5
        doc["step_time"]["uncontended"] = {"steps": 40, "cpu_ms": 7.0, "on_cpu_ms": 7.0,
                                           "blocked_ms": 1.0, "cpu_reference_ms": 0.5}
        assert summary_problems(doc) == []
    out = combine_repeats(docs)
    assert not {"cpu_reference_ms", "uncontended"} & set(out["step_time"])
    assert summary_problems(out) == []
