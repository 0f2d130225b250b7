"""A/B statistics: base and head measured in interleaved rounds on one machine, paired intervals
on the per-round differences, and the sequential decision taken after each round (docs/gate.md,
"A/B mode").

Each round runs both sides back to back (ABBA order: base first in odd rounds, head first in
even ones), so drift and contention on the machine hit both. The unit of evidence is a round's
*difference*: the ratio of the median step times (head / base) and each phase share's change
in percentage points (on a host clock the job's CPU time per step too, as an estimate). After
each round from ``min_rounds`` on, a Student-t interval on those differences decides: a
regression as soon as one metric's lower bound is past its tolerance, a pass as soon as every
metric's upper bound is inside it, otherwise one more round; at ``max_rounds`` the result is
inconclusive -- never a pass, never a regression. (The rule that excused wall time and shares
on a contended CPU served host-clock timings, which no longer decide: docs/noise.md.)

The deterministic counters and settings (scalar reads per step, bytes kept from each step, the
optimizer, FLOPs, the DataLoader's settings) are the same on every run of the same code, so one
pair of summaries says all they can: the first round's, compared by the stored-baseline
pipeline (gate/compare.py). One that regresses there makes the verdict a regression at once,
whatever the timings say; what changed is named as the gate names it (gate/causes.py).

**On a host clock** (a CPU runner) the timings inform (docs/gate.md, "The rule"): the first
round's comparison is the verdict. A measured figure that regressed there (memory, or a timing
past its host-clock band) is confirmed by more rounds, at most ``HOST_CONFIRM_ROUNDS`` in all:
a regression needs every round's pair to show it. The intervals are then estimates, shown
against the bands. Only on a device clock does the sequential test below decide.

Pure: no torch, no I/O; the caller supplies how to measure one side of one round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from traceml_ci.gate.ab.intervals import (
    Interval,
    Status,
    cpu_interval,
    quantile_for,
    share_deltas,
    share_intervals,
    step_interval,
)
from traceml_ci.gate.ab.result import (
    DEFAULT_MAX_ROUNDS,
    DEFAULT_MIN_ROUNDS,
    DEFAULT_SHARE_TOL_PP,
    DEFAULT_STEP_TOL_PCT,
    AbResult,
    AbSettings,
    Counters,
    compare_pair,
    measured_regressions,
)
from traceml_ci.gate.ab.rounds import RoundPair, Side, SideFigures, round_order
from traceml_ci.gate.judging import HOST_BAND_CPU_PCT, HOST_BAND_SHARE_PP
from traceml_ci.gate.results import Comparison, Verdict

#: Rounds before a regression: two rounds that happen to agree give a t interval (one degree
#: of freedom) that a loaded runner's noise clears by chance (an A/A false alarm, seen).
REGRESSION_MIN_ROUNDS = 3
#: On a host clock: rounds at most, when a measured figure regressed in the first round's pair
#: (the re-runs that confirm it); a pass or a count's regression takes one round.
HOST_CONFIRM_ROUNDS = 3

#: Re-exported: callers take A/B's types and defaults from here (gate/ab/rounds.py and
#: gate/ab/result.py define them).
__all__ = ["DEFAULT_MAX_ROUNDS", "DEFAULT_MIN_ROUNDS",
           "DEFAULT_SHARE_TOL_PP", "DEFAULT_STEP_TOL_PCT", "HOST_CONFIRM_ROUNDS",
           "AbResult", "AbSettings", "RoundPair", "Side",
           "SideFigures", "decide", "round_order", "run_rounds"]


def decide(rounds: Sequence[RoundPair], settings: AbSettings | None = None) -> AbResult:
    """Judge the rounds so far: regression when any metric or counter regressed, pass when all
    cleared, inconclusive at the cap, else undecided (verdict None: run another round)."""
    settings = settings or AbSettings()
    rounds = tuple(rounds)
    first = compare_pair(rounds[0], settings.rules) if rounds else None
    counters = Counters.of(first)
    if any(_host_clock(r) for r in rounds):
        return _decide_host(rounds, settings, counters, first)
    if counters.regressed:  # a count or a setting: no timing can say otherwise
        return AbResult(rounds, (), Verdict.REGRESSION, settings, counters, pairs=(first,))
    if len(rounds) < 2:
        return AbResult(rounds, (), None, settings, counters, pairs=(first,))
    result = _device_intervals(rounds, settings, counters, first)
    return dataclasses.replace(result, verdict=_device_verdict(result))


def _device_intervals(rounds: tuple[RoundPair, ...], settings: AbSettings, counters: Counters,
                      first: Comparison | None) -> AbResult:
    """The rounds' intervals on a device clock -- the step time and each share, family-wise
    95 % -- and no verdict yet. (A device clock's timings are the GPU's: the host's load does
    not move them, so nothing here is excused for contention.)"""
    n = len(rounds)
    deltas = share_deltas(rounds)  # once: it sizes the family and feeds the intervals
    q = quantile_for(1 + len(deltas), n)
    intervals = (step_interval(rounds, settings.step_tol_pct, q),
                 *share_intervals(rounds, settings.share_tol_pp, q, deltas))
    return AbResult(rounds, intervals, None, settings, counters, _cpu_wait_pct(rounds),
                    pairs=(first,))


def _device_verdict(result: AbResult) -> Verdict | None:
    """Regression once an interval is past its tolerance (from REGRESSION_MIN_ROUNDS on), pass
    once every one cleared, inconclusive at the cap; None: another round."""
    n, settings = len(result.rounds), result.settings
    if n < settings.min_rounds:
        return None
    if result.regressed and n >= REGRESSION_MIN_ROUNDS:
        return Verdict.REGRESSION
    if all(iv.status is Status.CLEARED for iv in result.intervals):
        return Verdict.PASS
    return Verdict.INCONCLUSIVE if n >= settings.max_rounds else None


def _host_clock(pair: RoundPair) -> bool:
    """Whether either run of a round was timed on the host clock."""
    from traceml_ci.summary.view import SummaryView

    return any(side.summary is not None and SummaryView(side.summary).host_clock
               for side in (pair.base, pair.head))


def _decide_host(rounds: tuple[RoundPair, ...], settings: AbSettings, counters: Counters,
                 first: Comparison | None) -> AbResult:
    """The verdict on a host clock: the first round's pair decides; a measured regression in
    it needs every round to show it, up to HOST_CONFIRM_ROUNDS (never past max_rounds)."""
    n = len(rounds)
    pairs = (first, *(compare_pair(r, settings.rules) for r in rounds[1:]))
    intervals: tuple[Interval, ...] = ()
    if n >= 2:  # estimates, against the bands a host clock's timings fail past
        deltas = share_deltas(rounds)
        q = quantile_for(2 + len(deltas), n)
        cpu = cpu_interval(rounds, HOST_BAND_CPU_PCT, q)
        intervals = (step_interval(rounds, HOST_BAND_CPU_PCT, q),
                     *(() if cpu is None else (cpu,)),
                     *share_intervals(rounds, HOST_BAND_SHARE_PP, q, deltas))
    confirmed = measured_regressions(first)
    for pair in pairs[1:]:
        confirmed &= measured_regressions(pair)
    verdict: Verdict | None
    if counters.regressed:
        verdict = Verdict.REGRESSION
    elif not confirmed:
        verdict = Verdict.PASS
    elif n >= min(HOST_CONFIRM_ROUNDS, settings.max_rounds):
        verdict = Verdict.REGRESSION
    else:
        verdict = None
    return AbResult(rounds, intervals, verdict, settings, counters, _cpu_wait_pct(rounds),
                    host_clock=True, pairs=pairs, confirmed=tuple(sorted(confirmed)))


def _cpu_wait_pct(rounds: Sequence[RoundPair]) -> float | None:
    """The most any run of either side waited for a CPU, % of its step (None unless every
    run measured it)."""
    found = [side.cpu_wait_pct for r in rounds for side in (r.base, r.head)]
    if not found or any(x is None for x in found):
        return None
    return max(x for x in found if x is not None)


#: Measures one side in one round: ``(side, round_no) -> SideFigures``.
Measure = Callable[[Side, int], SideFigures]


def run_rounds(
    measure: Measure,
    settings: AbSettings | None = None,
    on_round: Callable[[AbResult], None] | None = None,
) -> AbResult:
    """Run rounds in ABBA order until :func:`decide` gives a verdict (at most ``max_rounds``).
    ``on_round`` hears the result after each round (progress lines)."""
    settings = settings or AbSettings()
    rounds: list[RoundPair] = []
    while True:
        number = len(rounds) + 1
        got = {side: measure(side, number) for side in round_order(number)}
        rounds.append(RoundPair(number, base=got[Side.BASE], head=got[Side.HEAD]))
        result = decide(rounds, settings)
        if on_round is not None:
            on_round(result)
        if result.verdict is not None:
            return result
