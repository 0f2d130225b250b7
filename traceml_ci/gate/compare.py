"""The compare engine: base and head summaries in, a Comparison (rows, verdict, reasons) out.

Pure: no I/O, no printing, no exit codes. A regression is a result, not an exception.
The verdict rules (tolerance tiers, the noise rule, the label rules, the environment check) are
documented in docs/gate.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from traceml_ci.gate import fmt
from traceml_ci.gate.counters import PREFIX as COUNTERS
from traceml_ci.gate.counters import counter_rows
from traceml_ci.gate.metrics import (
    BY_NAME,
    METRICS,
    UNKNOWN_LABELS,
    Kind,
    Metric,
    good_labels,
)
from traceml_ci.gate.modules import (
    MIN_MOVE_WITHIN_PP,
    MODULE_PHASES,
    describe_movers,
    module_movers,
)
from traceml_ci.gate.rules import DEFAULT_RULES, Direction, Rule, Rules
from traceml_ci.summary.keys import CONTENDED_RUNQUEUE_WAIT_PCT, PHASES
from traceml_ci.summary.view import SummaryView

#: Load guard: other work on a shared machine stretches the slow steps, so it moves the median
#: step time a lot and the fastest steps (p10) little; a real slowdown moves both. A median that
#: regressed while p10 moved less than the rule's fail tolerance is only a warning.
LOAD_GUARD_METRIC = "step_time.step_ms.median"
LOAD_GUARD_QUANTILE = "step_time.step_ms.p10"

#: Absolute times measured with the host clock (CPU runs) also measure whatever else the machine
#: is doing: on a shared runner a steady neighbour slows every step of a run, its fastest ones
#: too, which no statistic of the run can tell from a slower step. Past their fail tier they
#: only warn, unless a rule sets ``fail = true``. Device-clock times (CUDA events) gate.
HOST_CLOCK_TIMES_WARN = True

#: Version of the JSON report (``--format json``).
REPORT_VERSION = "1.0"

#: A phase share that rose beyond tolerance is only a warning when the step got faster and that
#: phase's own median ms grew by at most this much (percent): its share rose because the *other*
#: phases got faster, not because it got slower.
SHARE_ONLY_MAX_MS_GROWTH_PCT = 10.0


#: The noise allowance is capped at this many fail tolerances: a summary's own spread can widen
#: what counts as noise, but not without bound (docs/gate.md, "The noise rule"). Not 1: under
#: the default "beyond" rule a cap at the tolerance itself would switch the noise rule off for
#: every change past the fail tier, honest noisy runs included.
NOISE_CAP_TOLERANCES = 2.0

#: Contention guard: a run whose main thread waited for a CPU at least
#: ``CONTENDED_RUNQUEUE_WAIT_PCT`` of its wall time (summary/keys.py) ran on a contended CPU.
#: Load stretches compute and spin phases and not sleeps, so it moves shares; a share that
#: regressed while either side ran contended is only a warning -- if the shift is one
#: contention could cause (below).
#: ... and never a shift larger than this (pp), whatever the waits: on the 2-core calibration
#: machine two CPU hogs moved shares by 5-9 pp, while the worst case contention_bound_pp allows
#: at waits of 40-60 % would excuse almost any shift.
CONTENTION_MAX_SHIFT_PP = 10.0


class Status(str, Enum):
    """The outcome of one metric."""

    OK = "ok"
    IMPROVED = "improved"
    WARN = "warn"
    REGRESSED = "regressed"
    NEW = "new"  # only head has a value
    MISSING = "missing"  # only base has a value


class Verdict(str, Enum):
    """The outcome of a whole comparison. The CLI maps it to an exit code."""

    PASS = "pass"
    WARN = "warn"
    REGRESSION = "regression"
    INCOMPARABLE = "incomparable"


@dataclass(frozen=True)
class Tolerance:
    """The rule a row was judged by, as shown in reports."""

    rule: Rule
    kind: Kind
    unit: str
    higher_is_worse: bool = True
    #: Whether past the fail tier regresses (the rule's ``fail``, or the host-clock default).
    fails: bool = True

    def __str__(self) -> str:
        r = self.rule
        if self.kind is Kind.LABEL:
            text = "any change" if r.direction is Direction.ANY else "no worse label"
            return text if self.fails else f"{text} (warn only)"
        sign = "±" if r.direction is Direction.ANY else ("+" if self.higher_is_worse else "−")
        fail = self._tier(r.abs, r.rel, sign)
        warn = self._tier(r.warn_abs, r.warn_rel, sign)
        if fail and warn:
            text = f"{fail} (warn {warn})"
        else:
            text = fail or (f"warn {warn}" if warn else "")
        return text if self.fails or not text else f"{text}, warn only"

    def _tier(self, a: float | None, rel: float | None, sign: str) -> str:
        unit = "pp" if self.kind is Kind.PCT else self.unit
        parts = []
        if rel is not None:
            parts.append(f"{sign}{rel:g}%")
        if a is not None:
            parts.append(f"{sign}{a:g} {unit}")
        return " and ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {**self.rule.to_dict(), "fails": self.fails, "text": str(self)}


@dataclass(frozen=True)
class Row:
    """One metric compared.

    ``delta``: percentage points for ``*_pct``; percent of base for times, memory and rates;
    MB per 1k steps for the growth slope; None for labels or when base is 0.
    ``tolerance``: None for informational rows, which never gate.
    ``noise``: how far the change had to go to clear the noise (noise_factor × combined IQR),
    in the metric's own unit; None when the summaries report no spread for it.
    """

    name: str
    base: float | str | None
    head: float | str | None
    delta: float | None
    tolerance: Tolerance | None
    status: Status
    unit: str = ""
    delta_unit: str = ""
    noise: float | None = None
    note: str = ""

    @property
    def gating(self) -> bool:
        return self.tolerance is not None

    @property
    def changed(self) -> bool:
        """Whether the row is worth showing unfolded: anything but a quiet ok."""
        return self.status is not Status.OK or bool(self.note)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "base": self.base,
            "head": self.head,
            "delta": self.delta,
            "delta_unit": self.delta_unit,
            "unit": self.unit,
            "tolerance": self.tolerance.to_dict() if self.tolerance else None,
            "noise": self.noise,
            "status": self.status.value,
            "note": self.note,
        }


@dataclass(frozen=True)
class Comparison:
    """A head summary against its base: one row per metric, the verdict and why.

    ``reasons``: the context (``notes``), then one line per regressed row.
    """

    verdict: Verdict
    rows: list[Row]
    reasons: list[str]
    base_run: str = ""
    head_run: str = ""
    skipped: list[str] = field(default_factory=list)
    rules_source: str = "defaults"
    #: The reasons that are not about one row (environment, mapping, noise, run status).
    notes: list[str] = field(default_factory=list)
    #: The ``distributed`` blocks of base and head (None for a single process), for the
    #: renderers' per-rank section; not part of the JSON report (its rows carry the verdict).
    distributed: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] = (None, None)

    def row(self, name: str) -> Row | None:
        return next((r for r in self.rows if r.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": REPORT_VERSION,
            "kind": "comparison",
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "base_run": self.base_run,
            "head_run": self.head_run,
            "rules": self.rules_source,
            "skipped": list(self.skipped),
            "rows": [r.to_dict() for r in self.rows],
        }


@dataclass(frozen=True)
class SetComparison:
    """Baseline sets compared key by key (e.g. one summary per test id)."""

    verdict: Verdict
    items: dict[str, Comparison]
    added: list[str]
    removed: list[str]
    reasons: list[str]
    rules_source: str = "defaults"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": REPORT_VERSION,
            "kind": "set",
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "rules": self.rules_source,
            "added": list(self.added),
            "removed": list(self.removed),
            "items": {k: {**c.to_dict(), "kind": "comparison"} for k, c in self.items.items()},
        }


# --- environment ---------------------------------------------------------------------------


def _torch_major(version: Any) -> str | None:
    if not isinstance(version, str) or not version:
        return None
    head = version.split(".", 1)[0]
    return head if head.isdigit() else None


def env_differences(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """What makes absolute times and memory of two runs incomparable: device type, GPU model,
    torch major version. A field unknown on either side is not a difference."""
    b, h = SummaryView(base).env, SummaryView(head).env
    out: list[str] = []
    bt, ht = b.get("device_type"), h.get("device_type")
    if isinstance(bt, str) and isinstance(ht, str) and bt != ht:
        out.append(f"device type {bt} → {ht}")
    elif bt == ht and bt not in (None, "cpu"):
        bn, hn = b.get("device_name"), h.get("device_name")
        if isinstance(bn, str) and isinstance(hn, str) and bn != hn:
            out.append(f"device {bn} → {hn}")
    bm, hm = _torch_major(b.get("torch")), _torch_major(h.get("torch"))
    if bm and hm and bm != hm:
        out.append(f"torch major version {bm} → {hm}")
    return out


# --- judging one metric --------------------------------------------------------------------


def _beyond(tier_abs: float | None, tier_rel: float | None, d_abs: float, d_rel: float) -> bool:
    """Whether a change is past every threshold a tier gives (none given: never)."""
    if tier_abs is None and tier_rel is None:
        return False
    return (tier_abs is None or d_abs > tier_abs) and (tier_rel is None or d_rel > tier_rel)


def _noise_threshold(metric: Metric, rule: Rule, base: Mapping[str, Any],
                     head: Mapping[str, Any], factor: float) -> float | None:
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
    tier_abs, tier_rel = (rule.abs, rule.rel) if rule.has_fail_tier else (rule.warn_abs,
                                                                          rule.warn_rel)
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


def _judge_number(metric: Metric, rule: Rule, b: float, h: float, noise: float | None,
                  *, fails: bool = True, margin: bool = True
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
    noise_note = f"within noise (±{noise:.3g} {_unit(metric)})" if noise is not None else ""
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


def _unit(metric: Metric) -> str:
    return "pp" if metric.kind is Kind.PCT else metric.unit


def _judge_label(metric: Metric, rule: Rule, b: str, h: str) -> tuple[Status, str]:
    if b == h:
        return Status.OK, ""
    if b in UNKNOWN_LABELS or h in UNKNOWN_LABELS:
        return Status.WARN, "too little data on one side to judge the label"
    good = good_labels(metric)
    if rule.direction is Direction.WORSE:
        if h in good and b not in good:
            return Status.IMPROVED, ""
        if h in good and b in good:
            return Status.WARN, "changed between healthy labels"
    if rule.fail is False:
        return Status.WARN, "diagnosis changed (rule: warn only)"
    return Status.REGRESSED, "diagnosis changed"


# --- compare ---------------------------------------------------------------------------------


def _run_name(v: SummaryView) -> str:
    count = v.repeats_count
    if count is None:
        return v.run_name
    return f"{v.run_name} (×{count} run{'' if count == 1 else 's'})"


def _fails(metric: Metric, rule: Rule, host_clock: bool) -> bool:
    """Whether past the fail tier is a regression: the rule's ``fail`` when set; by default
    yes, except absolute times measured with a host clock (HOST_CLOCK_TIMES_WARN)."""
    if rule.fail is not None:
        return rule.fail
    return not (HOST_CLOCK_TIMES_WARN and host_clock and metric.kind is Kind.TIME
                and metric.env_dependent)


def _mapping_notes(side: str, summary: Mapping[str, Any]) -> list[str]:
    mapped = SummaryView(summary).mapped_from
    if mapped is None:
        return []
    tool = mapped.get("tool", "another tool")
    version = mapped.get("schema_version", "?")
    unmapped = mapped.get("unmapped") or []
    text = f"{side} was mapped from {tool} (schema {version})"
    if unmapped:
        text += "; not mapped: " + ", ".join(str(u) for u in unmapped)
    return [text]


def _distributed(summary: Mapping[str, Any]) -> Mapping[str, Any] | None:
    block = summary.get("distributed")
    return block if isinstance(block, Mapping) else None


def _describe(row: Row) -> str:
    """One line for the reasons: what regressed, by how much, against which tolerance."""
    change = f"{fmt.value(row.base, row.unit)} → {fmt.value(row.head, row.unit)}"
    d = fmt.delta(row.delta, row.delta_unit)
    detail = "; ".join(x for x in (d, f"tolerance {row.tolerance}" if row.tolerance else "") if x)
    said = f": {row.note}" if row.name.startswith(COUNTERS) and row.note else ""
    return f"{row.name}: {change}" + (f" ({detail})" if detail else "") + said


def compare(
    base: Mapping[str, Any],
    head: Mapping[str, Any],
    rules: Rules = DEFAULT_RULES,
    *,
    allow_env_mismatch: bool = False,
) -> Comparison:
    """Compare two summary dicts (already validated, or mapped from traceml-ai) metric by metric.

    A metric regresses only when its change is beyond its fail tolerance *and* beyond the noise
    both summaries report (``rules.noise_factor`` × combined IQR across windows of steps).
    """
    reasons: list[str] = []
    skipped: list[str] = []
    reasons += _mapping_notes("base", base) + _mapping_notes("head", head)
    diffs = env_differences(base, head)
    skip_env = bool(diffs) and not allow_env_mismatch
    if diffs and skip_env:
        reasons.append(
            "environments differ (" + "; ".join(diffs) + "): absolute times and memory are "
            "skipped, phase shares still compared (--allow-env-mismatch compares all)"
        )
    elif diffs:
        reasons.append("environments differ (" + "; ".join(diffs) + "); compared anyway")
    bv, hv = SummaryView(base), SummaryView(head)
    dist = (_distributed(base), _distributed(head))
    b_world, h_world = bv.world_size, hv.world_size
    if b_world != h_world and not rules.allow_world_size_change:
        reasons.append(f"world size {b_world} → {h_world}: runs over different numbers of ranks "
                       "are not compared (rules: allow_world_size_change = true compares them)")
        return Comparison(verdict=Verdict.INCOMPARABLE, rows=[], reasons=reasons,
                          notes=list(reasons), base_run=_run_name(bv), head_run=_run_name(hv),
                          rules_source=rules.source, distributed=dist)
    empty = [(side, v) for side, v in (("base", bv), ("head", hv)) if v.steps_analyzed == 0]
    if empty:
        # A run that measured nothing (killed before its first steps, torch never imported,
        # fewer steps than its warmup) has no figure to pass or fail: never a silent pass.
        for side, v in empty:
            reasons.append(
                f"{side} analysed no steps ({v.run_status or 'status unknown'}, "
                f"{v.steps_total or 0} steps in all, {v.warmup_steps or 0} of them warmup): "
                "it measured nothing to compare"
            )
        return Comparison(verdict=Verdict.INCOMPARABLE, rows=[], reasons=reasons,
                          notes=list(reasons), base_run=_run_name(bv), head_run=_run_name(hv),
                          rules_source=rules.source, distributed=dist)
    missing_noise = [s for s, v in (("base", bv), ("head", hv)) if not v.has_noise]
    if missing_noise and rules.noise_factor > 0:
        reasons.append(
            f"no noise estimate in {' and '.join(missing_noise)} (too few steps, or not recorded)"
            ": the noise rule uses what the other side reports, else tolerances alone"
        )
    for side, v in (("base", bv), ("head", hv)):
        wait = v.runqueue_wait_pct
        if wait is not None and wait >= CONTENDED_RUNQUEUE_WAIT_PCT:
            reasons.append(f"{side} ran on a contended CPU (runqueue wait {wait:.0f} %): share "
                           "shifts it can explain only warn")

    host_clock = bv.host_clock or hv.host_clock
    rows: list[Row] = []
    for metric in METRICS:
        rule = rules.rule_for(metric.name)
        if rule.skip:
            continue
        b, h = metric.value(base), metric.value(head)
        if b is None and h is None:
            continue
        if metric.env_dependent and skip_env:
            skipped.append(metric.name)
            continue
        gating = metric.kind is Kind.LABEL or rule.has_fail_tier or rule.has_warn_tier
        fails = _fails(metric, rule, host_clock)
        tol = (Tolerance(rule, metric.kind, metric.unit, metric.higher_is_worse, fails)
               if gating else None)
        delta_unit = "" if metric.kind is Kind.LABEL else (
            "%" if metric.relative else _unit(metric)
        )
        common = dict(unit=metric.unit, delta_unit=delta_unit)
        if b is None:
            rows.append(Row(metric.name, b, h, None, tol, Status.NEW, **common))
            continue
        if h is None:
            status = Status.MISSING if gating else Status.OK
            rows.append(Row(metric.name, b, h, None, tol, status, **common,
                            note="no value in head"))
            continue
        if metric.kind is Kind.LABEL:
            status, note = _judge_label(metric, rule, b, h)
            rows.append(Row(metric.name, b, h, None, tol, status, **common, note=note))
            continue
        noise = _noise_threshold(metric, rule, base, head, rules.noise_factor)
        status, delta, note = _judge_number(metric, rule, b, h, noise, fails=fails,
                                            margin=rules.noise_rule == "margin")
        if note == "beyond tolerance (warn only)" and rule.fail is None:
            note = "host clock: warns only (see docs/gate.md)"
        rows.append(Row(metric.name, b, h, delta, tol, status, **common, noise=noise, note=note))

    rows = _share_context(rows, base, head, skip_env)
    rows = _load_guard(rows, base, head, rules)
    rows = _contention_guard(rows, base, head)
    rows = _label_jitter_exemption(rows)
    rows, module_context = _name_modules(rows, base, head, rules.noise_factor)
    rows += counter_rows(base, head)  # exact, no noise (gate/counters.py)
    reasons += module_context + _flops_context(base, head)

    head_status = hv.run_status
    run_warn = head_status not in (None, "completed")
    if run_warn:
        reasons.append(f"head run {head_status}: its figures may cover only part of the run")
    verdict = _verdict(rows, run_warn)
    if verdict is Verdict.INCOMPARABLE:
        reasons.append("nothing left to compare: no gated metric has a value on both sides")
    notes = list(reasons)
    reasons += [_describe(row) for row in rows if row.status is Status.REGRESSED]
    return Comparison(
        verdict=verdict, rows=rows, reasons=reasons, notes=notes, base_run=_run_name(bv),
        head_run=_run_name(hv), skipped=skipped, rules_source=rules.source, distributed=dist,
    )


def _share_context(rows: list[Row], base: Mapping[str, Any], head: Mapping[str, Any],
                   skip_env: bool) -> list[Row]:
    """Shares add up to 100, so one phase's change moves the others. Judge a phase's share by
    its own milliseconds where the runs are comparable:

    - a share that rose beyond tolerance while the step got faster and the phase's own median
      ms grew by at most SHARE_ONLY_MAX_MS_GROWTH_PCT is a warning, not a regression (the
      other phases got faster);
    - a share that fell is *improved* only if the phase's own ms fell by more than that much;
      otherwise it fell because other phases grew, and the row is ok with a note.
    """
    step = BY_NAME["step_time.step_ms.median"]
    b_step, h_step = step.value(base), step.value(head)
    out = []
    for row in rows:
        phase = row.name.removeprefix("step_time.").removesuffix("_pct")
        if phase not in PHASES or row.status not in (Status.REGRESSED, Status.IMPROVED):
            out.append(row)
            continue
        ms = BY_NAME[f"step_time.phase_ms.{phase}"]
        b_ms, h_ms = ms.value(base), ms.value(head)
        growth = None
        if not skip_env and b_ms and h_ms is not None:
            growth = (h_ms - b_ms) / b_ms * 100.0
        if row.status is Status.IMPROVED:
            if growth is None:
                row = _with(row, Status.OK, "share fell (its ms are not comparable here)")
            elif growth > -SHARE_ONLY_MAX_MS_GROWTH_PCT:
                row = _with(row, Status.OK, f"share fell as other phases grew ({phase} itself "
                            f"{growth:+.0f}% ms)")
        elif (
            growth is not None and growth <= SHARE_ONLY_MAX_MS_GROWTH_PCT
            and b_step is not None and h_step is not None and h_step < b_step
            and (row.delta or 0) > 0
        ):
            row = _with(row, Status.WARN, (
                f"share rose because other phases got faster ({phase} itself {growth:+.0f}% ms;"
                f" step {fmt.number(b_step)} → {fmt.number(h_step)} ms)"
            ))
        out.append(row)
    return out


def _load_guard(rows: list[Row], base: Mapping[str, Any], head: Mapping[str, Any],
                rules: Rules) -> list[Row]:
    """A median step time that regressed while the fastest steps did not is machine load."""
    rule = rules.rule_for(LOAD_GUARD_METRIC)
    q = BY_NAME[LOAD_GUARD_QUANTILE]
    b_q, h_q = q.value(base), q.value(head)
    if not b_q or h_q is None:
        return rows
    growth = (h_q - b_q) / b_q * 100.0
    out = []
    for row in rows:
        if row.name == LOAD_GUARD_METRIC and row.status is Status.REGRESSED and (
            rule.rel is None or growth <= rule.rel
        ) and (rule.abs is None or h_q - b_q <= rule.abs):
            row = _with(row, Status.WARN, f"fastest steps (p10) moved only {growth:+.0f}%: "
                        "more likely machine load than a slower step")
        out.append(row)
    return out


def contention_bound_pp(delta: float, base_pct: float, head_pct: float,
                        base_wait: float | None, head_wait: float | None) -> float:
    """The largest share shift (pp) in the direction of ``delta`` that the contended sides'
    runqueue waits (percent of wall time; None: quiet) can cause.

    A run that waited a fraction w of its wall time inside some phases, with a phase at share s,
    would have that phase at a share at most w·(1 − s)/(1 − w) lower, and at most w·s/(1 − w)
    higher, on a quiet CPU (the extremes: all the waiting outside, or inside, that phase). So a
    share that rose is explained by up to w·(1 − s)/(1 − w) of a contended head, plus up to
    w·s/(1 − w) of a contended base; a fall, the other way round. Never more than
    CONTENTION_MAX_SHIFT_PP: the worst case is loose, and heavy load would excuse anything.
    """
    rise = delta > 0
    total = 0.0  # capped at CONTENTION_MAX_SHIFT_PP below
    for wait, pct, contended_side_rises in ((head_wait, head_pct, rise),
                                            (base_wait, base_pct, not rise)):
        if wait is None or wait < CONTENDED_RUNQUEUE_WAIT_PCT:
            continue
        w, share = wait / 100.0, min(max(pct / 100.0, 0.0), 1.0)
        total += 100.0 * w * ((1.0 - share) if contended_side_rises else share) / (1.0 - w)
    return min(total, CONTENTION_MAX_SHIFT_PP)


def _contention_guard(rows: list[Row], base: Mapping[str, Any],
                      head: Mapping[str, Any]) -> list[Row]:
    """A share that regressed while either side ran on a contended CPU (runqueue wait at or above
    CONTENDED_RUNQUEUE_WAIT_PCT) is a warning, when the shift is within what the measured
    waits can cause (contention_bound_pp); a larger shift, or one between two quiet runs,
    still regresses."""
    waits = {"base": SummaryView(base).runqueue_wait_pct,
             "head": SummaryView(head).runqueue_wait_pct}
    contended = {s: w for s, w in waits.items() if w is not None
                 and w >= CONTENDED_RUNQUEUE_WAIT_PCT}
    if not contended:
        return rows
    if len(contended) == 2:
        note = ("both runs ran on contended CPUs: runqueue wait "
                f"{contended['base']:.0f} % (base), {contended['head']:.0f} % (head)")
    else:
        ((side, wait),) = contended.items()
        note = f"{side} ran on a contended CPU: runqueue wait {wait:.0f} %"
    out = []
    for row in rows:
        phase = row.name.removeprefix("step_time.").removesuffix("_pct")
        if (phase in PHASES and row.status is Status.REGRESSED and row.delta is not None
                and isinstance(row.base, float) and isinstance(row.head, float)
                and abs(row.delta) <= contention_bound_pp(row.delta, row.base, row.head,
                                                          waits["base"], waits["head"])):
            row = _with(row, Status.WARN, note)
        out.append(row)
    return out


def _name_modules(rows: list[Row], base: Mapping[str, Any], head: Mapping[str, Any],
                  noise_factor: float) -> tuple[list[Row], list[str]]:
    """A forward or backward share that regressed or warns says which sampled modules moved
    (gate/modules.py); where the phase held still, modules that moved within it beyond their
    noise are a line of context. Module times are sampled: they never decide a verdict."""
    out, context = [], []
    for row in rows:
        phase = row.name.removeprefix("step_time.").removesuffix("_pct")
        if phase in MODULE_PHASES and row.name == f"step_time.{phase}_pct":
            if row.status in (Status.REGRESSED, Status.WARN):
                movers = module_movers(base, head, phase, noise_factor)
                # The modules that moved the way the phase did: the others only diluted.
                same_way = [m for m in movers if row.delta is not None and m[1] * row.delta > 0]
                if not same_way:
                    out.append(row)
                    continue
                named = describe_movers(same_way, head=head, phase=phase)
                row = _with(row, row.status, f"{row.note}; {named}" if row.note else named)
            else:
                # The phase held: did time move between its modules? (Shares of the phase: a
                # phase that only lost share to another one moves none of its modules.)
                inside = module_movers(base, head, phase, noise_factor, of_step=False,
                                       least_pp=MIN_MOVE_WITHIN_PP)
                if inside:
                    context.append(f"time moved within {phase} (sampled modules, for "
                                   f"information): "
                                   f"{describe_movers(inside, head=head, phase=phase)}")
        out.append(row)
    return out, context


#: FLOP counts of one model and input shape agree to the FLOP; beyond this relative change the
#: work itself changed.
FLOPS_CHANGED = 0.001


def _flops_context(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """A changed FLOP count per step means the model or its input shapes changed: say so, as
    context for every share that moved (information, never a verdict)."""
    b = SummaryView(base).efficiency.get("flops_per_step")
    h = SummaryView(head).efficiency.get("flops_per_step")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
               for v in (b, h)):
        return []
    if abs(h - b) <= FLOPS_CHANGED * b:
        return []
    change = 100.0 * (h - b) / b
    return [f"FLOPs per step changed {fmt.flops(b)} → {fmt.flops(h)} ({change:+.1f} %): "
            "the model or its input shapes changed, not only how fast it runs"]


def _label_jitter_exemption(rows: list[Row]) -> list[Row]:
    """The step-time label is a function of the shares: if it flipped while no share
    regressed (moved beyond its tolerance and the noise), the run sits on a diagnosis
    threshold, and the flip is only a warning."""
    pct_rows = [r for r in rows if r.name.startswith("step_time.") and r.name.endswith("_pct")
                and r.gating]
    if not pct_rows or any(r.status is Status.REGRESSED for r in pct_rows):
        return rows
    if any(r.status in (Status.NEW, Status.MISSING) for r in pct_rows):
        return rows
    return [
        _with(r, Status.WARN, "label crossed a diagnosis threshold while no phase share "
              "regressed")
        if r.name == "step_time.diagnosis" and r.status is Status.REGRESSED else r
        for r in rows
    ]


def _with(row: Row, status: Status, note: str) -> Row:
    return Row(row.name, row.base, row.head, row.delta, row.tolerance, status, row.unit,
               row.delta_unit, row.noise, note)


def _verdict(rows: list[Row], run_warn: bool = False) -> Verdict:
    judged = [r for r in rows if r.gating and r.status not in (Status.NEW, Status.MISSING)]
    if not judged:
        return Verdict.INCOMPARABLE
    if any(r.status is Status.REGRESSED for r in rows):
        return Verdict.REGRESSION
    if run_warn or any(r.status in (Status.WARN, Status.MISSING) for r in rows):
        return Verdict.WARN
    return Verdict.PASS


#: Reasons list at most this many keys, then "(+N more)".
MAX_KEYS_LISTED = 10


def _keys(keys: list[str]) -> str:
    shown = ", ".join(keys[:MAX_KEYS_LISTED])
    return shown + (f" (+{len(keys) - MAX_KEYS_LISTED} more)" if len(keys) > MAX_KEYS_LISTED
                    else "")


def compare_sets(
    base: Mapping[str, Mapping[str, Any]],
    head: Mapping[str, Mapping[str, Any]],
    rules: Rules = DEFAULT_RULES,
    *,
    allow_env_mismatch: bool = False,
) -> SetComparison:
    """Compare baseline sets key by key. Keys only in head are *added* (no baseline yet: fine);
    keys only in base are *removed* (a warning). Any regressed key makes a regression."""
    common = [k for k in base if k in head]
    items = {
        k: compare(base[k], head[k], rules, allow_env_mismatch=allow_env_mismatch)
        for k in common
    }
    added = [k for k in head if k not in base]
    removed = [k for k in base if k not in head]
    return set_comparison(items, added, removed, rules.source)


def set_comparison(
    items: Mapping[str, Comparison],
    added: list[str],
    removed: list[str],
    rules_source: str = "defaults",
    notes: list[str] | None = None,
) -> SetComparison:
    """A SetComparison from per-key comparisons already made (``compare_sets``, or the pytest
    plugin, which compares each test as it finishes and must not compare it again).
    ``notes``: extra reasons, listed last (e.g. baseline keys a test session did not run)."""
    items = dict(items)
    reasons: list[str] = []
    verdicts = [c.verdict for c in items.values()]
    regressed = [k for k, c in items.items() if c.verdict is Verdict.REGRESSION]
    if regressed:
        verdict = Verdict.REGRESSION
        reasons.append(f"{len(regressed)} of {len(items)} regressed: " + _keys(regressed))
    elif not items or all(v is Verdict.INCOMPARABLE for v in verdicts):
        verdict = Verdict.INCOMPARABLE
        reasons.append("no key in common" if not items else "no key could be compared")
    elif removed or any(v in (Verdict.WARN, Verdict.INCOMPARABLE) for v in verdicts):
        verdict = Verdict.WARN
    else:
        verdict = Verdict.PASS
    incomparable = [k for k, c in items.items() if c.verdict is Verdict.INCOMPARABLE]
    if incomparable and verdict is not Verdict.INCOMPARABLE:
        reasons.append("not comparable: " + _keys(incomparable))
    if added:
        reasons.append(f"{len(added)} added (no baseline yet): " + _keys(added))
    if removed:
        reasons.append(f"{len(removed)} removed (in base, not in head): " + _keys(removed))
    reasons += notes or []
    return SetComparison(verdict, items, list(added), list(removed), reasons, rules_source)
