"""A/B statistics: base and head measured in interleaved rounds on one machine, paired intervals
on the per-round differences, and the sequential decision taken after each round (docs/gate.md,
"A/B mode").

Each round runs both sides back to back (ABBA order: base first in odd rounds, head first in
even ones), so drift and contention on the machine hit both. The unit of evidence is a round's
*difference*: the ratio of the median step times (head / base), the ratio of the job's CPU time
per step where both sides measured it (``step_cpu``: a loaded runner moves it far less than
wall time), and each phase share's change in percentage points. After each round from
``min_rounds`` on, a Student-t interval on those differences decides: a regression as soon as
one metric's lower bound is past its tolerance, a pass as soon as every metric's upper bound is
inside it, otherwise one more round; at ``max_rounds`` the result is inconclusive -- never a
pass, never a regression. Where a run waited for a CPU or the CPU ran slower for one side
(contended: ``CONTENDED_WAIT_PCT``, ``SPEED_MOVED_PCT``), wall time and shares move with the
machine's other work: a pass then needs only the metrics the load does not move cleared
(``LOAD_PROOF``: step CPU time, step time without CPU waits); the shares can still fail the
head on stronger evidence (``EXCUSED_ALPHA``), the wall clock cannot.

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
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from traceml_ci.errors import UsageError
from traceml_ci.gate.ab_intervals import (
    CONFIDENCE,
    CPU_METRIC,
    STEP_METRIC,
    UNLOADED_METRIC,
    Interval,
    Status,
    cpu_interval,
    cpu_ratios,
    quantile_for,
    share_deltas,
    share_intervals,
    step_interval,
    unloaded_interval,
    unloaded_ratios,
)
from traceml_ci.gate.ab_rounds import RoundPair, Side, SideFigures, round_order
from traceml_ci.gate.causes import surest
from traceml_ci.gate.judging import HOST_BAND_CPU_PCT, HOST_BAND_SHARE_PP
from traceml_ci.gate.lead import timings_said
from traceml_ci.gate.results import Comparison, Row, describe
from traceml_ci.gate.results import Status as RowStatus
from traceml_ci.gate.rules import DEFAULT_RULES, Rules

#: Tolerance of the median step time, % slower (head over base).
DEFAULT_STEP_TOL_PCT = 5.0
#: Tolerance of a phase share's growth, percentage points.
DEFAULT_SHARE_TOL_PP = 2.0
#: Rounds before any decision: one round's difference has no spread to judge it by.
DEFAULT_MIN_ROUNDS = 2
#: Rounds at most; a decision not reached by then is inconclusive. On a shared runner a round's
#: load-proof ratios vary by 4-8 % (the development VM, quiet or beside busy loops coming and
#: going): six rounds' interval is about ±7 %, too wide for unchanged code to clear a 5 %
#: tolerance in most A/Bs (6 of 26 did); twelve let it clear in 10 of 14 (docs/gate.md). A run
#: decides as soon as it can, so only a noisy run pays for the higher cap.
DEFAULT_MAX_ROUNDS = 12
#: The training thread's CPU waits, in % of its step time, from which a run counts as
#: contended. One such run among the rounds moves wall-clock step time and phase shares with
#: the machine's other work (a run waits either about nothing or about as long as it runs, seen
#: with busy loops coming and going), so a pass then rests on the figures the load does not
#: move (step CPU time, step time without CPU waits); the shares can still fail a head, on
#: stronger evidence (``EXCUSED_ALPHA``), but need not clear, and so can the wall clock where
#: the load fell on the head's runs alone (``_load_from_outside``).
CONTENDED_WAIT_PCT = 10.0
#: Rounds before the wall clock may fail a head on a contended CPU where the load only ever fell
#: on the head's runs (it may be the head's own doing; until then the wall clock must clear for
#: a pass): a random streak of three rounds with the busy loops on the head's runs was seen.
SELF_LOAD_MIN_ROUNDS = 6
#: How far apart, in %, the CPU reference of a round's two runs may be before the round counts
#: as contended too: the machine's CPU ran that much slower for one side, without any wait for
#: a CPU to show it (a busy neighbour core sharing caches and memory, another guest on the
#: host). Seen on the 2-core development VM with busy loops coming and going: the reference
#: 0.65 ms for one side and 0.93 for the other, wall time +120 %, both runs waiting 1 %.
#: Quiet rounds there stay within a few %.
SPEED_MOVED_PCT = 10.0
#: The metrics contention does not move: on a contended CPU, the ones a pass needs cleared.
LOAD_PROOF = (CPU_METRIC, UNLOADED_METRIC)
#: On a contended CPU, the family-wise error is split: most of it to the load-proof metrics
#: (narrow intervals, so unchanged code can pass), this much to the shares together (wide ones:
#: only a clear move of a share fails the head; the wall clock then never does).
EXCUSED_ALPHA = 0.01
#: Rounds before a regression: two rounds that happen to agree give a t interval (one degree
#: of freedom) that a loaded runner's noise clears by chance (an A/A false alarm, seen).
REGRESSION_MIN_ROUNDS = 3
#: On a host clock: rounds at most, when a measured figure regressed in the first round's pair
#: (the re-runs that confirm it); a pass or a count's regression takes one round.
HOST_CONFIRM_ROUNDS = 3

#: Re-exported: callers take the round's types from here (gate/ab_rounds.py defines them).
__all__ = ["AbResult", "AbSettings", "AbVerdict", "RoundPair", "Side", "SideFigures",
           "decide", "round_order", "run_rounds"]


class AbVerdict(str, Enum):
    """How an A/B ended. The CLI maps it to an exit code (inconclusive: its own, 7)."""

    PASS = "pass"
    REGRESSION = "regression"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class AbSettings:
    step_tol_pct: float = DEFAULT_STEP_TOL_PCT
    share_tol_pp: float = DEFAULT_SHARE_TOL_PP
    min_rounds: int = DEFAULT_MIN_ROUNDS
    max_rounds: int = DEFAULT_MAX_ROUNDS
    #: The rules each round's pair is compared by (gate/compare.py): the counts, the settings
    #: and, on a host clock, the whole verdict.
    rules: Rules = field(default=DEFAULT_RULES, compare=False)

    def __post_init__(self) -> None:
        if not 2 <= self.min_rounds <= self.max_rounds:
            raise UsageError(
                f"rounds: need 2 <= minimum ({self.min_rounds}) <= maximum ({self.max_rounds})"
            )
        for name, tol in (
            ("step tolerance", self.step_tol_pct),
            ("share tolerance", self.share_tol_pp),
        ):
            if not (math.isfinite(tol) and tol >= 0):
                raise UsageError(f"{name} {tol!r}: must be a finite number >= 0")


@dataclass(frozen=True)
class Counters:
    """The first round's summaries compared by the stored-baseline pipeline: the exact rows
    (counts, settings) and what changed as a headline names it."""

    rows: tuple[Row, ...] = ()
    causes: tuple[str, ...] = ()

    @classmethod
    def of(cls, pair: Comparison | None) -> Counters:
        """Nothing when the round's pair could not be compared (a side without its summary)."""
        if pair is None:
            return cls()
        return cls(tuple(r for r in pair.rows if r.evidence.exact), tuple(pair.causes))

    @property
    def regressed(self) -> list[Row]:
        return [r for r in self.rows if r.status is RowStatus.REGRESSED]


def compare_pair(pair: RoundPair, rules: Rules = DEFAULT_RULES) -> Comparison | None:
    """One round's two runs compared as the stored-baseline gate compares two summaries."""
    b, h = pair.base.summary, pair.head.summary
    if b is None or h is None:
        return None
    from traceml_ci.gate.compare import compare

    return compare(b, h, rules)


def _measured_regressions(pair: Comparison | None) -> set[str]:
    """The measured rows (timings past their band, memory) that regressed in a pair."""
    if pair is None:
        return set()
    return {r.name for r in pair.rows
            if r.status is RowStatus.REGRESSED and not r.evidence.exact}


@dataclass(frozen=True)
class AbResult:
    """The rounds so far, their intervals, the counters of the first round, and the verdict
    (None: another round is needed)."""

    rounds: tuple[RoundPair, ...]
    intervals: tuple[Interval, ...]
    verdict: AbVerdict | None
    settings: AbSettings = field(default_factory=AbSettings)
    counters: Counters = field(default_factory=Counters)
    #: The training thread's CPU waits in % of its step time, the most any run waited (None:
    #: not measured by every run).
    cpu_wait_pct: float | None = None
    #: Metrics a pass does not need cleared: wall time and shares where a run was contended
    #: (the shares can still regress, on stronger evidence; the wall clock cannot).
    excused: frozenset[str] = frozenset()
    #: How much slower the machine's CPU ran for one side of a round than for the other, the
    #: most over the rounds, in % (the CPU reference's ratio; None: not timed by every run).
    cpu_speed_moved_pct: float | None = None
    #: Whether a run was timed on a host clock: the rounds' pairs decide, timings inform.
    host_clock: bool = False
    #: Each round's two runs compared by the stored-baseline pipeline (host clock; on a device
    #: clock the first round's alone), None where a side had no summary.
    pairs: tuple[Comparison | None, ...] = ()
    #: Host clock: the measured rows that regressed in every round's pair so far.
    confirmed: tuple[str, ...] = ()

    @property
    def contended(self) -> bool:
        """Whether a pass rests on the load-proof metrics alone."""
        return bool(self.excused)

    @property
    def causes(self) -> tuple[str, ...]:
        """What the summaries say changed, the surest first (gate/causes.py)."""
        return self.counters.causes

    @property
    def regressed(self) -> list[Interval]:
        return [iv for iv in self.intervals if iv.status is Status.REGRESSED]

    @property
    def undecided(self) -> list[Interval]:
        """Undecided metrics a pass needs cleared."""
        return [iv for iv in self.intervals
                if iv.status is Status.UNDECIDED and iv.metric not in self.excused]

    @property
    def step(self) -> Interval | None:
        return next((iv for iv in self.intervals if iv.metric == STEP_METRIC), None)

    @property
    def cpu(self) -> Interval | None:
        return next((iv for iv in self.intervals if iv.metric == CPU_METRIC), None)

    def reason(self) -> str:
        """The verdict in one line of plain words (metric names are our own phase names)."""
        n = len(self.rounds)
        rounds = f"{n} round{'s' if n != 1 else ''}"
        if self.host_clock:
            return self._host_reason(rounds)
        if self.verdict is AbVerdict.REGRESSION:
            moved = "; ".join(
                [_said(iv) for iv in self.regressed]
                + [r.note for r in surest(self.counters.regressed)]
            )
            return f"regression after {rounds}: {moved}"
        contended = ""
        if self.excused:
            which = "step time and shares" if STEP_METRIC in self.excused else "the shares"
            contended = (f"; {self.why_contended()}, so {which}, which move with the "
                         "machine's other work, were not needed to clear")
            step = self.step
            if STEP_METRIC in self.excused and step is not None and step.low > step.tolerance:
                contended += (f" (step time {_signed(step.estimate, step.unit)}, not judged: "
                              "the load fell on both sides' runs)")
        if self.verdict is AbVerdict.PASS:
            needed = [iv.label for iv in self.intervals if iv.metric not in self.excused]
            if not self.excused:
                return f"pass after {rounds}: every metric within tolerance"
            return f"pass after {rounds}: {' and '.join(needed)} within tolerance{contended}"
        noisy = "; ".join(_said(iv) for iv in self.undecided)
        if self.verdict is AbVerdict.INCONCLUSIVE:
            return f"inconclusive after {rounds}: {noisy} too noisy to decide{contended}; re-run"
        return f"undecided after {rounds}: {noisy}{contended}"

    def _host_reason(self, rounds: str) -> str:
        """The verdict on a host clock: what the counts said, what the timings showed."""
        first = self.pairs[0] if self.pairs else None
        timings = timings_said(first) if first is not None else ""
        if self.verdict is AbVerdict.REGRESSION:
            if self.counters.regressed:
                return f"regression after {rounds}: " + "; ".join(
                    r.note for r in surest(self.counters.regressed))
            rows = [r for r in (first.rows if first else ()) if r.name in self.confirmed]
            return (f"regression after {rounds}, in every round: "
                    + "; ".join(describe(r) for r in rows))
        checked = f"{len(self.counters.rows)} counts and settings unchanged"
        moved = sorted(_measured_regressions(first))
        if self.verdict is AbVerdict.PASS:
            tail = (f"; {', '.join(moved)} regressed in round 1, not in every round since: not "
                    "confirmed" if moved else "")
            return (f"pass after {rounds}: {checked}; timings (host clock) inform: "
                    f"{timings or 'not measured'}{tail}")
        return f"undecided after {rounds}: confirming {', '.join(moved)}"

    def why_contended(self) -> str:
        """What made the rounds count as contended, in words ("" when they did not)."""
        if not self.excused:
            return ""
        said = []
        if self.cpu_wait_pct is not None and self.cpu_wait_pct >= CONTENDED_WAIT_PCT:
            said.append(f"a run waited {self.cpu_wait_pct:.0f} % of its step for a CPU")
        moved = self.cpu_speed_moved_pct
        if moved is not None and moved >= SPEED_MOVED_PCT:
            said.append(f"the CPU ran {moved:.0f} % slower for one side of a round "
                        "(its CPU reference)")
        return " and ".join(said)


def _signed(x: float, unit: str) -> str:
    return f"{x:+.1f}{'%' if unit == '%' else ' pp'}"


def _said(iv: Interval) -> str:
    held = (
        "; its phase got faster, so the others' speed-up raised it"
        if iv.time_grew is False and iv.low > iv.tolerance
        else ""
    )
    return (
        f"{iv.label} {_signed(iv.estimate, iv.unit)} (95% interval "
        f"{_signed(iv.low, iv.unit)} .. {_signed(iv.high, iv.unit)}, tolerance "
        f"{_signed(iv.tolerance, iv.unit)}{held})"
    )


def decide(rounds: Sequence[RoundPair], settings: AbSettings | None = None) -> AbResult:
    """Judge the rounds so far: regression when any metric or counter regressed, pass when all
    cleared, inconclusive at the cap, else undecided (verdict None: run another round)."""
    settings = settings or AbSettings()
    rounds = tuple(rounds)
    n = len(rounds)
    first = compare_pair(rounds[0], settings.rules) if rounds else None
    counters = Counters.of(first)
    if any(_host_clock(r) for r in rounds):
        return _decide_host(rounds, settings, counters, first)
    if counters.regressed:  # a count or a setting: no timing can say otherwise
        return AbResult(rounds, (), AbVerdict.REGRESSION, settings, counters, pairs=(first,))
    if n < 2:
        return AbResult(rounds, (), None, settings, counters, pairs=(first,))
    deltas = share_deltas(rounds)  # once: it sizes the family and feeds the intervals
    has_cpu = cpu_ratios(rounds) is not None
    has_unloaded = unloaded_ratios(rounds) is not None
    waited = _cpu_wait_pct(rounds)
    moved = _cpu_speed_moved_pct(rounds)
    # A contended run moves wall time and shares, and so does a CPU that ran slower for one
    # side: a pass rests on what the load does not move.
    contended = has_unloaded and (
        (waited is not None and waited >= CONTENDED_WAIT_PCT)
        or (moved is not None and moved >= SPEED_MOVED_PCT)
    )
    # The wall clock on a contended CPU measures the load as much as the code: an A/A whose
    # busy loops happened to fall on the head's runs three rounds running read +110-200 %
    # each, a false regression. Where the load came from outside (it fell on the base's runs
    # too), the wall clock may clear, never fail. Load that only ever fell on the head's runs
    # may be the head's own (its threads or worker processes taking the CPUs, which no
    # load-proof figure sees): then the wall clock must clear for a pass, and may fail the
    # head once that has held for SELF_LOAD_MIN_ROUNDS rounds, past any random streak.
    outside = contended and _load_from_outside(rounds)
    proof = has_cpu + has_unloaded
    q = quantile_for(proof + 1 + len(deltas), n)
    q_rest = q
    if contended:  # the error split: narrow load-proof intervals, wide others
        rest = len(deltas) + (not outside)  # what the excused error is spent on
        q = quantile_for(proof, n, 1.0 - CONFIDENCE - (EXCUSED_ALPHA if rest else 0.0))
        q_rest = quantile_for(max(rest, 1), n, EXCUSED_ALPHA)
    cpu = cpu_interval(rounds, settings.step_tol_pct, q)
    unloaded = unloaded_interval(rounds, settings.step_tol_pct, q)
    step = step_interval(rounds, settings.step_tol_pct, q_rest)
    if outside or (contended and n < SELF_LOAD_MIN_ROUNDS):
        step = dataclasses.replace(step, can_regress=False)
    intervals = (
        step,
        *(() if cpu is None else (cpu,)),
        *(() if unloaded is None else (unloaded,)),
        *share_intervals(rounds, settings.share_tol_pp, q_rest, deltas),
    )
    excused = frozenset(
        iv.metric for iv in intervals
        if contended and iv.metric not in LOAD_PROOF
        and (outside or iv.metric != STEP_METRIC)  # the head's own load: the wall must clear
    )
    result = AbResult(rounds, intervals, None, settings, counters, waited, excused, moved,
                      pairs=(first,))
    verdict: AbVerdict | None = None
    if n >= settings.min_rounds:
        if result.regressed and n >= REGRESSION_MIN_ROUNDS:
            verdict = AbVerdict.REGRESSION
        elif all(iv.status is Status.CLEARED for iv in intervals if iv.metric not in excused):
            verdict = AbVerdict.PASS
        elif n >= settings.max_rounds:
            verdict = AbVerdict.INCONCLUSIVE
    return dataclasses.replace(result, verdict=verdict)


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
    confirmed = _measured_regressions(first)
    for pair in pairs[1:]:
        confirmed &= _measured_regressions(pair)
    verdict: AbVerdict | None
    if counters.regressed:
        verdict = AbVerdict.REGRESSION
    elif not confirmed:
        verdict = AbVerdict.PASS
    elif n >= min(HOST_CONFIRM_ROUNDS, settings.max_rounds):
        verdict = AbVerdict.REGRESSION
    else:
        verdict = None
    return AbResult(rounds, intervals, verdict, settings, counters,
                    _cpu_wait_pct(rounds), frozenset(), _cpu_speed_moved_pct(rounds),
                    host_clock=True, pairs=pairs, confirmed=tuple(sorted(confirmed)))


def _cpu_wait_pct(rounds: Sequence[RoundPair]) -> float | None:
    """The most any run of either side waited for a CPU, % of its step (None unless every
    run measured it)."""
    found = [side.cpu_wait_pct for r in rounds for side in (r.base, r.head)]
    if not found or any(x is None for x in found):
        return None
    return max(x for x in found if x is not None)


def _load_from_outside(rounds: Sequence[RoundPair]) -> bool:
    """Whether some round's extra load fell on the base's run: it waited for a CPU
    ``CONTENDED_WAIT_PCT`` more than the head's, or its CPU ran ``SPEED_MOVED_PCT`` slower. Load
    that only ever falls on the head's runs may be the head's own doing."""
    for r in rounds:
        wb, wh = r.base.cpu_wait_pct, r.head.cpu_wait_pct
        if wb is not None and wh is not None and wb - wh >= CONTENDED_WAIT_PCT:
            return True
        speed = r.cpu_speed_ratio
        if speed is not None and speed * (1.0 + SPEED_MOVED_PCT / 100.0) <= 1.0:
            return True
    return False


def _cpu_speed_moved_pct(rounds: Sequence[RoundPair]) -> float | None:
    """How much slower, in %, the CPU ran for one side of a round than for the other, the
    most over the rounds (None unless every run timed the CPU reference)."""
    ratios = [r.cpu_speed_ratio for r in rounds]
    if not ratios or any(x is None for x in ratios):
        return None
    return max(100.0 * math.expm1(abs(math.log(x))) for x in ratios if x is not None)


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
