"""The compare pipeline: base and head summaries in, a Comparison (rows, verdict, reasons) out.

Pure: no I/O, no printing, no exit codes. A regression is a result, not an exception. Each step
lives in its own module -- the result types (results.py), judging one metric (judging.py), the
guard chain (guards.py), the context about the runs as a whole (context.py), sets (sets.py) --
and reads the one parsed view of each side. The verdict rules are documented in docs/gate.md.
The names other modules imported from here before the split are re-exported.
"""

from __future__ import annotations

from traceml_ci.gate.causes import known_causes
from traceml_ci.gate.context import (
    FLOPS_CHANGED,
    distributed_block,
    env_differences,
    environment_notes,
    flops_context,
    head_status_notes,
    headline_rank_notes,
    incomparable_notes,
    mapping_notes,
    measurement_notes,
    run_name,
)
from traceml_ci.gate.counted.counters import counter_rows
from traceml_ci.gate.counted.settings import setting_rows
from traceml_ci.gate.judging import (
    HOST_BAND_CPU_PCT,
    HOST_BAND_SHARE_PP,
    NOISE_CAP_TOLERANCES,
    judge_metrics,
)
from traceml_ci.gate.results import (
    REPORT_VERSION,
    Comparison,
    Row,
    SetComparison,
    Status,
    Tolerance,
    Verdict,
    describe,
    verdict_of,
)
from traceml_ci.gate.rules import DEFAULT_RULES, Rules
from traceml_ci.gate.timing.guards import (
    CONTENTION_MAX_SHIFT_PP,
    LOAD_GUARD_METRIC,
    LOAD_GUARD_QUANTILE,
    SHARE_ONLY_MAX_MS_GROWTH_PCT,
    apply_guards,
    contention_bound_pp,
)
from traceml_ci.summary.keys import CONTENDED_RUNQUEUE_WAIT_PCT
from traceml_ci.summary.view import SummaryLike, as_view

__all__ = [
    "CONTENDED_RUNQUEUE_WAIT_PCT",
    "CONTENTION_MAX_SHIFT_PP",
    "FLOPS_CHANGED",
    "HOST_BAND_SHARE_PP",
    "HOST_BAND_CPU_PCT",
    "LOAD_GUARD_METRIC",
    "LOAD_GUARD_QUANTILE",
    "NOISE_CAP_TOLERANCES",
    "REPORT_VERSION",
    "SHARE_ONLY_MAX_MS_GROWTH_PCT",
    "Comparison",
    "Row",
    "SetComparison",
    "Status",
    "Tolerance",
    "Verdict",
    "compare",
    "contention_bound_pp",
    "env_differences",
]


def compare(
    base: SummaryLike,
    head: SummaryLike,
    rules: Rules = DEFAULT_RULES,
    *,
    allow_env_mismatch: bool = False,
) -> Comparison:
    """Compare two summaries (dicts already validated or mapped from traceml-ai, or views over
    them) metric by metric.

    A metric regresses only when its change is beyond its fail tolerance *and* beyond the noise
    both summaries report (``rules.noise_factor`` × combined IQR across windows of steps).
    """
    bv, hv = as_view(base), as_view(head)
    diffs = env_differences(bv, hv)
    skip_env = bool(diffs) and not allow_env_mismatch
    reasons = mapping_notes("base", bv) + mapping_notes("head", hv)
    reasons += environment_notes(diffs, skip_env)
    named = dict(
        base_run=run_name(bv),
        head_run=run_name(hv),
        rules_source=rules.source,
        distributed=(distributed_block(bv), distributed_block(hv)),
    )
    refused = incomparable_notes(bv, hv, rules)
    if refused:
        reasons += refused
        return Comparison(
            verdict=Verdict.INCOMPARABLE, rows=[], reasons=reasons, notes=list(reasons), **named
        )
    reasons += measurement_notes(bv, hv, rules) + headline_rank_notes(bv, hv)
    rows, skipped = judge_metrics(bv, hv, rules, skip_env=skip_env)
    rows, module_context = apply_guards(rows, bv, hv, rules, skip_env=skip_env)
    rows += setting_rows(bv, hv) + counter_rows(bv, hv)  # exact, no noise
    reasons += module_context + flops_context(bv, hv)
    run_notes = head_status_notes(hv)
    reasons += run_notes
    verdict = verdict_of(rows, run_warn=bool(run_notes))
    if verdict is Verdict.INCOMPARABLE:
        reasons.append("nothing left to compare: no gated metric has a value on both sides")
    notes = list(reasons)
    reasons += [describe(row) for row in rows if row.status is Status.REGRESSED]
    return Comparison(
        verdict=verdict,
        rows=rows,
        reasons=reasons,
        notes=notes,
        skipped=skipped,
        causes=known_causes(bv, hv, rows),
        splits=(bv.shares(), hv.shares()),
        **named,
    )
