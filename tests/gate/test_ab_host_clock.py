"""A/B on a host clock (gate/ab/sequential.py, docs/gate.md "The rule"): the first round's
pair, compared
by the stored-baseline pipeline, decides; timings inform, and one past its band must show in
every round (up to HOST_CONFIRM_ROUNDS) to fail."""

from __future__ import annotations

import copy

from tests.gate.summaries import BASE_MS, make, shift
from tests.gate.test_counters import COUNTERS
from traceml_ci.gate.ab import report as ab_report
from traceml_ci.gate.ab.sequential import (
    HOST_CONFIRM_ROUNDS,
    Side,
    SideFigures,
    run_rounds,
)
from traceml_ci.gate.judging import HOST_BAND_CPU_PCT
from traceml_ci.gate.results import Verdict


def host(ms=None, **kw):
    doc = make(ms, clock="host", **kw)
    doc["counters"] = copy.deepcopy(COUNTERS)
    return doc


def measuring(base_doc, head_docs):
    """Each round's base is ``base_doc``; the head's round n is ``head_docs(n)``."""
    calls = []

    def measure(side: Side, n: int) -> SideFigures:
        calls.append((n, side))
        doc = base_doc if side is Side.BASE else head_docs(n)
        return SideFigures.from_summary(doc)

    return measure, calls


def test_unchanged_code_passes_after_one_round_with_the_timings_as_an_estimate():
    measure, calls = measuring(host(), lambda n: host(shift(dataloader=0.4)))
    result = run_rounds(measure)
    assert (result.verdict, len(result.rounds), len(calls)) == (Verdict.PASS, 1, 2)
    assert result.host_clock
    reason = result.reason()
    assert reason.startswith("pass after 1 round: ")
    assert "counts and settings unchanged" in reason and "timings (host clock) inform:" in reason
    assert "dataloader +" in reason and "step 20.0 ms → 20.4 ms" in reason


def test_a_timing_shift_short_of_its_band_passes_in_one_round():
    slower = {p: v * 1.6 for p, v in BASE_MS.items()}  # +60 % step time, +8 pp of a share
    measure, _ = measuring(host(), lambda n: host(shift(slower, dataloader=4.0)))
    result = run_rounds(measure)
    assert (result.verdict, len(result.rounds)) == (Verdict.PASS, 1)


def test_a_share_past_its_band_in_one_round_only_is_not_confirmed():
    measure, _ = measuring(host(), lambda n: host(shift(dataloader=12.0)) if n == 1 else host())
    result = run_rounds(measure)
    assert (result.verdict, len(result.rounds)) == (Verdict.PASS, 2)
    assert "step_time.dataloader_pct regressed in round 1" in result.reason()
    assert "not confirmed" in result.reason()


def test_a_share_past_its_band_in_every_round_regresses():
    measure, _ = measuring(host(), lambda n: host(shift(dataloader=12.0)))
    result = run_rounds(measure)
    assert (result.verdict, len(result.rounds)) == (Verdict.REGRESSION, HOST_CONFIRM_ROUNDS)
    assert result.confirmed == ("step_time.dataloader_pct",)
    assert result.reason().startswith(f"regression after {HOST_CONFIRM_ROUNDS} rounds, in every "
                                      "round: step_time.dataloader_pct: 20.0% → 50.0%")
    # the intervals are estimates against the bands
    step = next(iv for iv in result.intervals if iv.metric == "step_time")
    assert step.tolerance == HOST_BAND_CPU_PCT


def test_a_count_decides_in_the_first_round_and_the_report_folds_the_rounds():
    head = host()
    head["counters"]["syncs"] = {"per_step": 2, "sites": [
        {"at": "train.py:42", "op": "item", "count": 1},
        {"at": "mlrepo/train.py:25", "op": "item", "count": 1}]}
    measure, calls = measuring(host(), lambda n: head)
    result = run_rounds(measure)
    assert (result.verdict, len(calls)) == (Verdict.REGRESSION, 2)
    assert result.causes[0].startswith("adds 1 scalar read per step at mlrepo/train.py:25")
    md = ab_report.render_markdown(result, "main")
    assert "<details><summary>Rounds" in md
    assert "Decided by counts" in md
