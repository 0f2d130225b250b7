"""Confirmation: which results are worth another run, and the sequential procedure that runs
them (traceml_ci.gate.confirm), on summaries built from a real one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests.gate.summaries import make, shift
from tests.gate.test_contention_rule import contended
from traceml_ci.gate import DEFAULT_RULES, Comparison, Verdict, compare
from traceml_ci.gate.confirm import confirm, worth_confirming
from traceml_ci.summary.repeats import combine_repeats

BASE = make()


def _ms_for_pp(pp: float) -> float:
    """ms to add to the base's dataloader for its share to rise by ``pp`` (20 ms step, 20 %)."""
    share, step = 0.20, 20.0
    p = share + pp / 100.0
    return (p * step - share * step) / (1.0 - p)


def head(pp: float, **kw: Any) -> dict[str, Any]:
    return make(shift(dataloader=_ms_for_pp(pp)), **kw)


def judge(docs: Sequence[dict[str, Any]]) -> Comparison:
    return compare(BASE, combine_repeats(docs) if len(docs) > 1 else docs[0], DEFAULT_RULES)


def close(c: Comparison, docs: Sequence[dict[str, Any]]) -> bool:
    return worth_confirming(c, BASE, combine_repeats(docs) if len(docs) > 1 else docs[0])


@pytest.mark.parametrize(("pp", "worth"), [(0.0, False), (2.0, False), (4.0, True),
                                           (8.0, True)])
def test_a_share_past_its_warn_tier_is_worth_another_run(pp: float, worth: bool) -> None:
    h = head(pp)
    c = compare(BASE, h)
    assert c.verdict is (Verdict.REGRESSION if pp > 5 else Verdict.WARN if pp > 3
                         else Verdict.PASS)
    assert worth_confirming(c, BASE, h) is worth


def test_a_close_share_within_the_noise_is_worth_another_run_too() -> None:
    h = head(4.0, iqr_pp=5.0)  # past the warn tier, inside the noise: the row itself is ok
    c = compare(BASE, h)
    assert c.row("step_time.dataloader_pct").status.value == "ok"
    assert worth_confirming(c, BASE, h)


def test_a_shift_the_heads_contention_explains_is_not_re_run_for() -> None:
    h = contended(head(4.0), 30.0)
    c = compare(contended(make(), 0.5), h)
    assert not worth_confirming(c, contended(make(), 0.5), h)
    quiet = contended(head(4.0), 0.5)
    assert worth_confirming(compare(BASE, quiet), BASE, quiet)


def test_a_slower_step_alone_is_not_re_run_for() -> None:
    slower = make({p: ms * 1.2 for p, ms in shift().items()})  # same split, +20 % step
    c = compare(BASE, slower)
    assert c.verdict is Verdict.WARN
    assert not worth_confirming(c, BASE, slower)


class Job:
    """A job whose runs come from a list, counting how many were made."""

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        self.runs = list(runs)
        self.made = 0

    def rerun(self) -> dict[str, Any]:
        self.made += 1
        return self.runs[self.made]

    def go(self, max_reruns: int = 2):
        return confirm(
            [self.runs[0]], judge, regressed=lambda c: c.verdict is Verdict.REGRESSION,
            suspect=lambda c: close(c, self.runs[: self.made + 1]), rerun=self.rerun,
            max_reruns=max_reruns,
        )


def test_a_clean_first_run_costs_one_run() -> None:
    job = Job([head(0.5), head(9.0), head(9.0)])
    done = job.go()
    assert (done.reruns, job.made, done.result.verdict) == (0, 0, Verdict.PASS)


def test_a_first_run_that_came_close_is_re_run_and_a_real_shift_is_caught() -> None:
    job = Job([head(4.0), head(8.0), head(8.0)])
    done = job.go()
    assert done.first.verdict is Verdict.WARN
    assert done.reruns == 2 and len(done.docs) == 3
    assert done.result.verdict is Verdict.REGRESSION
    assert not done.first_run_discounted


def test_the_procedure_stops_as_soon_as_the_combination_is_clean() -> None:
    job = Job([head(4.0), head(-2.0), head(9.0)])  # mean of the two: +1 pp
    done = job.go()
    assert done.reruns == 1 and done.result.verdict is Verdict.PASS


def test_one_disturbed_first_run_is_discounted_when_the_re_runs_alone_are_clean() -> None:
    job = Job([head(45.0), head(1.5), head(2.0)])  # the mean of three still regresses
    done = job.go()
    assert judge(done.docs).verdict is Verdict.REGRESSION
    assert done.first_run_discounted and done.result.verdict is not Verdict.REGRESSION
    assert done.reruns == 2


def test_without_a_rerun_or_with_zero_reruns_the_first_judgement_stands() -> None:
    runs = [head(8.0), head(0.0)]
    assert confirm(runs[:1], judge, regressed=lambda c: True, suspect=lambda c: True,
                   rerun=None).reruns == 0
    job = Job([head(8.0), head(0.0)])
    done = job.go(max_reruns=0)
    assert done.reruns == 0 and done.result.verdict is Verdict.REGRESSION


def test_a_count_that_regressed_is_never_re_run_for() -> None:
    import copy

    from tests.gate.test_counters import COUNTERS

    b, h = make(), head(8.0)  # a share that regressed too: the count decides anyway
    b["counters"], h["counters"] = copy.deepcopy(COUNTERS), copy.deepcopy(COUNTERS)
    h["counters"]["syncs"] = {"per_step": 3, "sites": [
        {"at": "train.py:9", "op": "item", "count": 3}]}
    c = compare(b, h)
    assert c.verdict is Verdict.REGRESSION
    assert not worth_confirming(c, b, h)


@pytest.mark.parametrize(("pp", "worth"), [(4.0, False), (20.0, False), (30.0, True)])
def test_on_a_host_clock_only_a_share_past_its_band_is_re_run_for(pp: float, worth: bool) -> None:
    b, h = make(clock="host"), make(shift(dataloader=_ms_for_pp(pp)), clock="host")
    c = compare(b, h)
    assert c.verdict is (Verdict.REGRESSION if worth else Verdict.PASS)
    assert worth_confirming(c, b, h) is worth
