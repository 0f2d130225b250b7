"""How an A/B ended and why: the verdict (``Verdict``), the settings it ran by
(``AbSettings``), the first round's exact rows (``Counters``), and the rounds, intervals and
reason together (``AbResult``). gate/ab/sequential.py decides; this says."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from traceml_ci.errors import UsageError
from traceml_ci.gate.ab.intervals import CPU_METRIC, STEP_METRIC, Interval, Status
from traceml_ci.gate.ab.rounds import RoundPair
from traceml_ci.gate.causes import surest
from traceml_ci.gate.render.lead import timings_said
from traceml_ci.gate.results import Comparison, Row, Verdict, describe
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
#: tolerance in most A/Bs (6 of 26 did); twelve let it clear in 10 of 14 (docs/noise.md). A run
#: decides as soon as it can, so only a noisy run pays for the higher cap.
DEFAULT_MAX_ROUNDS = 12


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


def measured_regressions(pair: Comparison | None) -> set[str]:
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
    verdict: Verdict | None
    settings: AbSettings = field(default_factory=AbSettings)
    counters: Counters = field(default_factory=Counters)
    #: The training thread's CPU waits in % of its step time, the most any run waited (None:
    #: not measured by every run).
    cpu_wait_pct: float | None = None
    #: Whether a run was timed on a host clock: the rounds' pairs decide, timings inform.
    host_clock: bool = False
    #: Each round's two runs compared by the stored-baseline pipeline (host clock; on a device
    #: clock the first round's alone), None where a side had no summary.
    pairs: tuple[Comparison | None, ...] = ()
    #: Host clock: the measured rows that regressed in every round's pair so far.
    confirmed: tuple[str, ...] = ()

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
        return [iv for iv in self.intervals if iv.status is Status.UNDECIDED]

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
        if self.verdict is Verdict.REGRESSION:
            moved = "; ".join(
                [_said(iv) for iv in self.regressed]
                + [r.note for r in surest(self.counters.regressed)]
            )
            return f"regression after {rounds}: {moved}"
        if self.verdict is Verdict.PASS:
            return f"pass after {rounds}: every metric within tolerance"
        noisy = "; ".join(_said(iv) for iv in self.undecided)
        if self.verdict is Verdict.INCONCLUSIVE:
            return f"inconclusive after {rounds}: {noisy} too noisy to decide; re-run"
        return f"undecided after {rounds}: {noisy}"

    def _host_reason(self, rounds: str) -> str:
        """The verdict on a host clock: what the counts said, what the timings showed."""
        first = self.pairs[0] if self.pairs else None
        timings = timings_said(first) if first is not None else ""
        if self.verdict is Verdict.REGRESSION:
            if self.counters.regressed:
                return f"regression after {rounds}: " + "; ".join(
                    r.note for r in surest(self.counters.regressed))
            rows = [r for r in (first.rows if first else ()) if r.name in self.confirmed]
            return (f"regression after {rounds}, in every round: "
                    + "; ".join(describe(r) for r in rows))
        checked = f"{len(self.counters.rows)} counts and settings unchanged"
        moved = sorted(measured_regressions(first))
        if self.verdict is Verdict.PASS:
            tail = (f"; {', '.join(moved)} regressed in round 1, not in every round since: not "
                    "confirmed" if moved else "")
            return (f"pass after {rounds}: {checked}; timings (host clock) inform: "
                    f"{timings or 'not measured'}{tail}")
        return f"undecided after {rounds}: confirming {', '.join(moved)}"



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
