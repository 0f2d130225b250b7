"""Judging one metric: its tolerance tiers, the noise threshold, and the status of a number or a
label row. The rules are documented in docs/gate.md ("How a row is judged").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from traceml_ci.gate.metrics import METRICS, UNKNOWN_LABELS, Kind, Metric, good_labels
from traceml_ci.gate.results import Evidence, Row, Status, Tolerance
from traceml_ci.gate.rules import Direction, Rule, Rules
from traceml_ci.summary.keys import ALL_PHASES, WAIT_PHASE
from traceml_ci.summary.view import SummaryView

#: On a host clock (a CPU runner) a timing figure -- a share, the step time, a label the shares
#: or the ranks' times decide -- measures whatever else the machine is doing as much as the code
#: (CPU speed moves +-30 % between runs of a shared runner). It informs: its own tolerance only
#: says that it moved. Alone it fails only past a band that unchanged code never reached there
#: (docs/gate.md, "The rule", measured by benchmarks/cisuite), and a re-run must confirm it.
#: A rule with ``fail = true`` keeps its own tiers on a host clock.
#: A share: +25 pp. Unchanged code's single runs moved a share up to 15.2 pp beside two busy
#: loops and a parallel test run on 2 cores (benchmarks/cisuite, 20 A/B sessions' first rounds).
HOST_BAND_SHARE_PP = 25.0
#: ... the job's CPU time per step (``step_time.cpu_ms``): four times the base's. Not the
#: wall-clock step time, which a loaded runner stretched 3.5x for unchanged code
#: (benchmarks/cisuite: the tiny GPT-2's 7.8 ms median at 26.9 ms beside two busy loops, three
#: runs in a row); it only informs on a host clock. Not twice: torch's intra-op threads spin
#: while a preempted peer runs elsewhere, so an oversubscribed runner (two busy loops and a
#: parallel test run on 2 cores) took an unchanged MLP's CPU per step from 3.28 to 7.66 ms
#: (2.3x) in three runs in a row.
HOST_BAND_CPU_PCT = 300.0
#: ... the straggler's own work above the other ranks' median, in pp of it: balanced ranks' CPU
#: time per step differed by up to 47 % on the 2-core runner beside busy loops.
HOST_BAND_STRAGGLER_PP = 100.0
#: The bands by metric name; a timed metric not named here only informs on a host clock. The
#: wait share has none: on a host clock it times the other rank's scheduling as much as the
#: collectives (an unchanged 2-rank DDP job's moved 29.6 pp in one run beside busy loops).
HOST_BANDS: dict[str, Rule] = {
    **{f"step_time.{phase}_pct": Rule(abs=HOST_BAND_SHARE_PP)
       for phase in ALL_PHASES if phase != WAIT_PHASE},
    "step_time.cpu_ms": Rule(rel=HOST_BAND_CPU_PCT),
    "distributed.straggler.score_pct": Rule(abs=HOST_BAND_STRAGGLER_PP),
}

#: The noise allowance is capped at this many fail tolerances: a summary's own spread can widen
#: what counts as noise, but not without bound (docs/gate.md, "The noise rule"). Not 1: under
#: the default "beyond" rule a cap at the tolerance itself would switch the noise rule off for
#: every change past the fail tier, honest noisy runs included.
NOISE_CAP_TOLERANCES = 2.0


def _beyond(tier_abs: float | None, tier_rel: float | None, d_abs: float, d_rel: float) -> bool:
    """Whether a change is past every threshold a tier gives (none given: never)."""
    if tier_abs is None and tier_rel is None:
        return False
    return (tier_abs is None or d_abs > tier_abs) and (tier_rel is None or d_rel > tier_rel)


def noise_threshold(
    metric: Metric, rule: Rule, base: SummaryView, head: SummaryView, factor: float
) -> float | None:
    """``factor`` × √(IQR_base² + IQR_head²), symmetric in base and head, and never more than
    NOISE_CAP_TOLERANCES × the rule's fail tolerance: the spread a summary reports about itself
    can widen its allowance only that far (a head reporting an IQR of 35 pp, or 1e6, for a
    share cannot turn a +30 pp regression into "within noise")."""
    spreads = [s for s in (metric.noise(base), metric.noise(head)) if s is not None]
    if not spreads or factor <= 0:
        return None
    noise = factor * math.hypot(*spreads)
    cap = _noise_cap(rule, metric.value(base))
    return noise if cap is None else min(noise, cap)


def _noise_cap(rule: Rule, b: Any) -> float | None:
    """The largest noise allowance (metric's unit) a rule admits: NOISE_CAP_TOLERANCES × the
    change its fail tier (else its warn tier) calls too large from base ``b``."""
    tier_abs, tier_rel = (
        (rule.abs, rule.rel) if rule.has_fail_tier else (rule.warn_abs, rule.warn_rel)
    )
    if tier_abs is None and tier_rel is None:
        return None
    limits = [tier_abs or 0.0]
    if tier_rel is not None and isinstance(b, float):
        limits.append(tier_rel / 100.0 * abs(b))
    return NOISE_CAP_TOLERANCES * max(limits)


def _relative(d: float, b: float) -> float:
    """``d`` in percent of ``b``; from a base of 0, any change is infinitely large."""
    if b != 0:
        return d / abs(b) * 100.0
    return 0.0 if d == 0 else math.copysign(math.inf, d)


def _past(tier_abs: float | None, tier_rel: float | None, amount: float, b: float) -> bool:
    """Whether a change of ``amount`` (in the metric's unit, positive = counted direction) from
    base ``b`` is past a tier."""
    return _beyond(tier_abs, tier_rel, amount, _relative(amount, b))


def judge_number(
    metric: Metric,
    rule: Rule,
    b: float,
    h: float,
    noise: float | None,
    *,
    fails: bool = True,
    margin: bool = True,
) -> tuple[Status, float | None, str]:
    """Status of one numeric row. ``noise``: the noise threshold (metric's unit) or None.
    ``margin``: the change less the noise must pass the tier (else: the change must pass the
    tier and, separately, exceed the noise). ``fails``: whether past the fail tier regresses."""
    d = h - b
    d_rel = _relative(d, b)
    delta: float | None = (None if b == 0 and d != 0 else d_rel) if metric.relative else d
    if delta is not None and not math.isfinite(delta):
        delta = None
    if not (rule.has_fail_tier or rule.has_warn_tier):
        return Status.OK, delta, ""
    worse_sign = 1.0 if metric.higher_is_worse else -1.0
    worse = abs(d) if rule.direction is Direction.ANY else d * worse_sign
    better = -d * worse_sign

    def significant(amount: float) -> float | None:
        """The amount that counts after the noise; None when it does not clear the noise."""
        if noise is None:
            return amount
        if margin:
            return amount - noise
        return amount if abs(d) > noise else None

    def past(tier_abs: float | None, tier_rel: float | None, amount: float | None) -> bool:
        return amount is not None and _past(tier_abs, tier_rel, amount, b)

    sig_worse, sig_better = significant(worse), significant(better)
    noise_note = f"within noise (±{noise:.3g} {unit_of(metric)})" if noise is not None else ""
    if past(rule.abs, rule.rel, sig_worse):
        if not fails:
            return Status.WARN, delta, "beyond tolerance (warn only)"
        return Status.REGRESSED, delta, ""
    if past(rule.abs, rule.rel, worse):
        return Status.WARN, delta, f"beyond tolerance but {noise_note}"
    if past(rule.warn_abs, rule.warn_rel, sig_worse):
        return Status.WARN, delta, ""
    if past(rule.warn_abs, rule.warn_rel, worse):
        return Status.OK, delta, noise_note
    if rule.direction is Direction.WORSE:
        tier = (rule.warn_abs, rule.warn_rel) if rule.has_warn_tier else (rule.abs, rule.rel)
        if past(*tier, sig_better):
            return Status.IMPROVED, delta, ""
    return Status.OK, delta, ""


def unit_of(metric: Metric) -> str:
    """How a change of ``metric`` is written: pp for shares, else its own unit."""
    return "pp" if metric.kind is Kind.PCT else metric.unit


def judge_label(metric: Metric, rule: Rule, b: str, h: str) -> tuple[Status, str]:
    """Status and note of one label row: any change regresses, except a move to a healthy
    label (improved), to or from too little data (said, ok), between healthy labels (warn), or
    under a warn-only rule."""
    if b == h:
        return Status.OK, ""
    if b in UNKNOWN_LABELS or h in UNKNOWN_LABELS:  # nothing to judge: said, never a warning
        return Status.OK, "too little data on one side to judge the label"
    good = good_labels(metric)
    if rule.direction is Direction.WORSE:
        if h in good and b not in good:
            return Status.IMPROVED, ""
        if h in good and b in good:
            return Status.WARN, "changed between healthy labels"
    if rule.fail is False:
        return Status.WARN, "diagnosis changed (rule: warn only)"
    return Status.REGRESSED, "diagnosis changed"


def evidence_of(metric: Metric, host_clock: bool) -> Evidence:
    """What a metric's figure is, on the clock the runs were timed with."""
    if metric.timed:
        return Evidence.HOST_CLOCK if host_clock else Evidence.DEVICE_CLOCK
    if metric.path[0] == "step_memory":
        return Evidence.MEMORY
    if metric.path[0] == "gpu":
        return Evidence.DEVICE
    return Evidence.COUNT


def informs_only(metric: Metric, rule: Rule, host_clock: bool) -> bool:
    """Whether the metric's own tiers only inform: a timed figure on a host clock, unless its
    rule says ``fail = true`` (HOST_BANDS then decide, where one is named)."""
    return host_clock and metric.timed and rule.fail is not True


def judge_metrics(
    base: SummaryView, head: SummaryView, rules: Rules, *, skip_env: bool
) -> tuple[list[Row], list[str]]:
    """One row per metric either side has a value for, each judged on its own (the guards
    come after), and the names of the environment-dependent metrics skipped (``skip_env``)."""
    rows: list[Row] = []
    skipped: list[str] = []
    host_clock = base.host_clock or head.host_clock
    unmapped_b, unmapped_h = _unmapped(base), _unmapped(head)
    for metric in METRICS:
        rule = rules.rule_for(metric.name)
        if rule.skip:
            continue
        b, h = metric.value(base), metric.value(head)
        if metric.name in unmapped_b:
            b = None
        if metric.name in unmapped_h:
            h = None
        if b is None and h is None:
            continue
        if metric.name in unmapped_b | unmapped_h:  # a figure the other tool's summary lacked
            rows.append(Row(metric.name, b, h, None, None, Status.OK, unit=metric.unit,
                            evidence=evidence_of(metric, host_clock),
                            note="not judged: no figure on one side (not mapped from traceml-ai)"))
            continue
        if metric.env_dependent and skip_env:
            skipped.append(metric.name)
            continue
        rows.append(_judge_metric(metric, rule, b, h, base, head, rules, host_clock))
    return rows, skipped


def _unmapped(summary: SummaryView) -> set[str]:
    """The metrics a summary mapped from another tool's has no real figure for."""
    mapped = summary.mapped_from
    return {str(u) for u in mapped.get("unmapped") or ()} if mapped else set()


def _judge_metric(
    metric: Metric,
    rule: Rule,
    b: Any,
    h: Any,
    base: SummaryView,
    head: SummaryView,
    rules: Rules,
    host_clock: bool,
) -> Row:
    """The row of one metric with a value on at least one side."""
    if host_clock and metric.path[0] == "step_memory" and rule.has_warn_tier:
        # RSS moves with the runner's load: between the tiers it is said by the delta, no more
        rule = dataclasses.replace(rule, warn_abs=None, warn_rel=None)
    gating = metric.kind is Kind.LABEL or rule.has_fail_tier or rule.has_warn_tier
    informs = informs_only(metric, rule, host_clock)
    band = HOST_BANDS.get(metric.name) if informs else None
    fails = rule.fail is not False
    if informs:  # the band judges; the rule's tiers are shown beside it
        own = str(Tolerance(rule, metric.kind, metric.unit, metric.higher_is_worse))
        tol = Tolerance(band or Rule(), metric.kind, metric.unit, metric.higher_is_worse,
                        band is not None, informs=own or "no tolerance")
        tol = tol if gating or band is not None else None
    else:
        tol = (
            Tolerance(rule, metric.kind, metric.unit, metric.higher_is_worse, fails)
            if gating else None
        )
    delta_unit = "" if metric.kind is Kind.LABEL else ("%" if metric.relative else unit_of(metric))
    common: dict[str, Any] = dict(
        unit=metric.unit, delta_unit=delta_unit, evidence=evidence_of(metric, host_clock)
    )
    if b is None:
        return Row(metric.name, b, h, None, tol, Status.NEW, **common)
    if h is None:
        status = Status.MISSING if gating and not informs else Status.OK
        return Row(metric.name, b, h, None, tol, status, **common, note="no value in head")
    if metric.kind is Kind.LABEL:
        status, note = judge_label(metric, rule, b, h)
        if informs and status is not Status.OK:  # the shares (or ranks' times) decide
            status, note = Status.OK, f"{_label_note(status, note)} (informs)"
        return Row(metric.name, b, h, None, tol, status, **common, note=note)
    noise = noise_threshold(metric, rule, base, head, rules.noise_factor)
    margin = rules.noise_rule == "margin"
    status, delta, note = judge_number(metric, rule, b, h, noise, fails=fails, margin=margin)
    if informs:
        moved = status in (Status.REGRESSED, Status.WARN, Status.IMPROVED)
        status, note = Status.OK, ""
        if band is not None:
            noise = noise_threshold(metric, band, base, head, rules.noise_factor)
            status, _, note = judge_number(metric, band, b, h, noise, margin=margin)
            # past the band the better way, or within the noise: said, never a warning
            if status is Status.IMPROVED:
                status, note = Status.OK, ""
            elif status is Status.WARN:
                status, note = Status.OK, f"informs ({note})"
        if moved and status is Status.OK and not note:
            note = f"informs (past {tol.informs if tol else 'its tolerance'})"
    return Row(metric.name, b, h, delta, tol, status, **common, noise=noise, note=note)


def _label_note(status: Status, note: str) -> str:
    """What a label's change would have said, for its host-clock note."""
    if status is Status.IMPROVED:
        return "improved"
    return note or "changed"
