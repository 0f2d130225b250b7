"""Repeated runs combined: the figures besides shares and times -- the training thread's, the
memory peaks, the CPU contention -- each taken over the runs by its own rule."""

from __future__ import annotations

from tests.summary.test_repeats import runs
from traceml_ci.summary.repeats import combine_repeats
from traceml_ci.summary.schema import summary_problems


def test_thread_figures_are_the_runs_median_of_those_every_run_has() -> None:
    docs = runs(3.0, 4.0, 9.0)
    for doc, wait in zip(docs, (0.5, 2.0, 1.0), strict=True):
        doc["step_time"]["thread"] = {"cpu_wait_ms": wait, "cpu_ms": 7.123456}
    docs[0]["step_time"]["thread"]["voluntary_switches"] = 3.0  # one run only: left out
    assert combine_repeats(docs)["step_time"]["thread"] == {"cpu_wait_ms": 1.0, "cpu_ms": 7.1235}
    del docs[1]["step_time"]["thread"]  # a run without the block: no block at all
    assert "thread" not in combine_repeats(docs)["step_time"]


def test_memory_peaks_and_contention_are_the_largest_runs_not_the_median_runs() -> None:
    docs = runs(3.0, 4.0, 9.0)  # the median run (the summary's base) is the second
    for doc, rss, wait in zip(docs, (500.0, 300.0, 310.0), (3.0, 1.0, 2.0), strict=True):
        doc["step_memory"]["peak_rss_mb"] = rss
        doc["run"]["contention"] = {"runqueue_wait_pct": wait}
    out = combine_repeats(docs)
    assert out["step_memory"]["peak_rss_mb"] == 500.0  # the cold first run's
    assert out["run"]["contention"]["runqueue_wait_pct"] == 3.0
    assert summary_problems(out) == []
