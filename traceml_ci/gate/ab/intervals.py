"""A/B's metric intervals: per-round differences of the paired rounds (gate/ab/sequential.py) as
Student-t intervals, each judged against its tolerance -- step time and step CPU time as %
change of the ratio (from the mean log ratio), each phase share as pp of change."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from traceml_ci.gate.ab.tdist import t975, t_quantile
from traceml_ci.summary.keys import phase_union

if TYPE_CHECKING:
    from traceml_ci.gate.ab.rounds import RoundPair

#: The intervals' two-sided confidence level, for the metrics together: each of the m metrics
#: judged gets 1 - 0.05/m (Bonferroni), so noise moves any one of them past its bound in at
#: most 5 % of looks, not 5 % per metric.
CONFIDENCE = 0.95
#: Float rounding of a bound, below any tolerance anyone sets (% or pp).
_ROUNDING = 1e-9

#: The step-time metric's name in reports and JSON.
STEP_METRIC = "step_time"
#: The job's CPU time per step (``step_time.cpu_ms``): a loaded runner stretches wall time
#: far more than it moves this, so a slower code path shows here when wall time is too noisy.
CPU_METRIC = "step_cpu"
#: How the ratio metrics are named to a person.
_LABELS = {STEP_METRIC: "step time", CPU_METRIC: "step CPU time"}


class Status(str, Enum):
    """One metric's interval against its tolerance."""

    REGRESSED = "regressed"  # the lower bound is past the tolerance
    CLEARED = "cleared"  # the upper bound is inside it: no regression that large is plausible
    UNDECIDED = "undecided"  # the interval straddles the tolerance: too noisy so far


@dataclass(frozen=True)
class Interval:
    """A metric's paired interval after some rounds. For step time the values are % change of
    the median step time (from the mean log ratio); for a share, pp of change."""

    metric: str
    unit: str  # "%" or "pp"
    estimate: float
    low: float
    high: float
    tolerance: float
    per_round: tuple[float, ...]
    #: A share only: whether the phase's own time grew too (the mean of the rounds' log ratios
    #: of its ms above 0; None: not known). A share that rose while its phase got faster rose
    #: because the others got faster still -- on a loaded runner, the contention of the runs,
    #: not the code (seen: four A/A rounds agreeing on dataloader +3 to +4 pp, each with the
    #: head's steps faster).
    time_grew: bool | None = None

    @property
    def status(self) -> Status:
        # A bound exactly at the tolerance is inside it, whatever the float rounding of
        # log/expm1 left (1.05 -> 5.000000000000004 %).
        if self.low > self.tolerance + _ROUNDING:
            if self.time_grew is False:
                return Status.UNDECIDED
            return Status.REGRESSED
        if self.high <= self.tolerance:
            return Status.CLEARED
        return Status.UNDECIDED

    @property
    def label(self) -> str:
        """How the metric is named to a person: ``step time``, ``forward share``."""
        return _LABELS.get(self.metric) or f"{self.metric} share"


def quantile_for(metrics: int, rounds: int, alpha: float = 1.0 - CONFIDENCE) -> float:
    """The t quantile of each metric's interval: two-sided error ``alpha`` (default: that of
    ``CONFIDENCE``) for ``metrics`` together."""
    return t_quantile(1.0 - alpha / 2.0 / max(1, metrics), rounds - 1)


def _t_interval(values: Sequence[float], q: float | None = None) -> tuple[float, float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    half = (t975(n - 1) if q is None else q) * math.sqrt(var / n)
    return mean, mean - half, mean + half


def _ratio_interval(
    metric: str, ratios: Sequence[float], tol_pct: float, q: float | None
) -> Interval:
    """A t interval on the rounds' log ratios, shown as % change."""
    logs = [math.log(r) for r in ratios]
    mean, low, high = _t_interval(logs, q)

    def pct(x: float) -> float:
        return math.expm1(x) * 100.0

    return Interval(
        metric, "%", pct(mean), pct(low), pct(high), tol_pct, tuple(pct(v) for v in logs)
    )


def step_interval(rounds: Sequence[RoundPair], tol_pct: float, q: float | None = None) -> Interval:
    """The step time's interval: a t interval on the rounds' log ratios, shown as % change;
    ``q`` the t quantile (default: a 95 % interval of this metric alone)."""
    return _ratio_interval(STEP_METRIC, [r.step_ratio for r in rounds], tol_pct, q)


def _all(ratios: Sequence[float | None]) -> list[float] | None:
    return None if any(x is None for x in ratios) else [float(x) for x in ratios if x]


def cpu_ratios(rounds: Sequence[RoundPair]) -> list[float] | None:
    """Each round's CPU ratio, or None unless both sides have it in every round."""
    return _all([r.cpu_ratio for r in rounds])


def cpu_interval(
    rounds: Sequence[RoundPair], tol_pct: float, q: float | None = None
) -> Interval | None:
    """The step CPU time's interval, judged as step time's (same tolerance); None unless
    every round has it on both sides."""
    ratios = cpu_ratios(rounds)
    return None if ratios is None else _ratio_interval(CPU_METRIC, ratios, tol_pct, q)


def share_deltas(rounds: Sequence[RoundPair]) -> dict[str, list[float]]:
    """Each phase either side measured in every round: its per-round changes, in display
    order. The phases are the summaries' own (``SummaryView.phases``: the wait phase where a
    run used a process group); one that no side of a round has is skipped."""
    out = {}
    for phase in phase_union(*(side.shares for r in rounds for side in (r.base, r.head))):
        deltas = [r.share_delta_pp(phase) for r in rounds]
        if all(d is not None for d in deltas):
            out[phase] = [float(d) for d in deltas if d is not None]
    return out


def share_intervals(
    rounds: Sequence[RoundPair],
    tol_pp: float,
    q: float | None = None,
    deltas: Mapping[str, list[float]] | None = None,
) -> list[Interval]:
    """One interval per phase either side measured in every round, in display order.
    ``deltas``: ``share_deltas(rounds)`` when the caller has it already."""
    out = []
    for phase, values in (share_deltas(rounds) if deltas is None else deltas).items():
        mean, low, high = _t_interval(values, q)
        logs = [r.phase_log_ratio(phase) for r in rounds]
        grew = None if any(v is None for v in logs) else sum(logs) / len(logs) > 0  # type: ignore[arg-type]
        out.append(Interval(phase, "pp", mean, low, high, tol_pp, tuple(values), grew))
    return out
