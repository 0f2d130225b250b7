"""The guard chain: after each metric is judged on its own, guards that read both runs as a whole
soften a row whose change has a better explanation than a slower step -- shares that moved
because other phases changed, machine load, CPU contention, a label on a diagnosis threshold --
and name the sampled modules that moved. Each guard takes the rows and the two parsed views and
returns new rows; no guard makes a row worse. docs/gate.md explains each one.
"""

from __future__ import annotations

from traceml_ci.gate import fmt
from traceml_ci.gate.metrics import BY_NAME
from traceml_ci.gate.results import Row, Status, with_status
from traceml_ci.gate.rules import Rules
from traceml_ci.gate.timing.modules import (
    MIN_MOVE_WITHIN_PP,
    MODULE_PHASES,
    describe_movers,
    module_movers,
)
from traceml_ci.summary.keys import CONTENDED_RUNQUEUE_WAIT_PCT, PHASES
from traceml_ci.summary.view import SummaryView

#: Load guard: other work on a shared machine stretches the slow steps, so it moves the median
#: step time a lot and the fastest steps (p10) little; a real slowdown moves both. A median that
#: regressed while p10 moved less than the rule's fail tolerance is only a warning.
LOAD_GUARD_METRIC = "step_time.step_ms.median"
LOAD_GUARD_QUANTILE = "step_time.step_ms.p10"

#: A phase share that rose beyond tolerance is only a warning when the step got faster and that
#: phase's own median ms grew by at most this much (percent): its share rose because the *other*
#: phases got faster, not because it got slower.
SHARE_ONLY_MAX_MS_GROWTH_PCT = 10.0

#: Contention guard: a run whose main thread waited for a CPU at least
#: ``CONTENDED_RUNQUEUE_WAIT_PCT`` of its wall time (summary/keys.py) ran on a contended CPU.
#: Load stretches compute and spin phases and not sleeps, so it moves shares; a share that
#: regressed while either side ran contended is only a warning -- if the shift is one
#: contention could cause (below).
#: ... and never a shift larger than this (pp), whatever the waits: on the 2-core calibration
#: machine two CPU hogs moved shares by 5-9 pp, while the worst case contention_bound_pp allows
#: at waits of 40-60 % would excuse almost any shift.
CONTENTION_MAX_SHIFT_PP = 10.0


def apply_guards(
    rows: list[Row], base: SummaryView, head: SummaryView, rules: Rules, *, skip_env: bool
) -> tuple[list[Row], list[str]]:
    """The rows after every guard, in order, and the context lines the module guard adds."""
    rows = share_context(rows, base, head, skip_env)
    rows = load_guard(rows, base, head, rules)
    rows = contention_guard(rows, base, head)
    rows = label_jitter_exemption(rows)
    return name_modules(rows, base, head, rules.noise_factor)


def share_context(
    rows: list[Row], base: SummaryView, head: SummaryView, skip_env: bool
) -> list[Row]:
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
                row = with_status(row, Status.OK, "share fell (its ms are not comparable here)")
            elif growth > -SHARE_ONLY_MAX_MS_GROWTH_PCT:
                row = with_status(
                    row,
                    Status.OK,
                    f"share fell as other phases grew ({phase} itself {growth:+.0f}% ms)",
                )
        elif (
            growth is not None
            and growth <= SHARE_ONLY_MAX_MS_GROWTH_PCT
            and b_step is not None
            and h_step is not None
            and h_step < b_step
            and (row.delta or 0) > 0
        ):
            row = with_status(
                row,
                Status.WARN,
                (
                    f"share rose because other phases got faster ({phase} itself {growth:+.0f}% ms;"
                    f" step {fmt.number(b_step)} → {fmt.number(h_step)} ms)"
                ),
            )
        out.append(row)
    return out


def load_guard(rows: list[Row], base: SummaryView, head: SummaryView, rules: Rules) -> list[Row]:
    """A median step time that regressed while the fastest steps did not is machine load."""
    rule = rules.rule_for(LOAD_GUARD_METRIC)
    q = BY_NAME[LOAD_GUARD_QUANTILE]
    b_q, h_q = q.value(base), q.value(head)
    if not b_q or h_q is None:
        return rows
    growth = (h_q - b_q) / b_q * 100.0
    out = []
    for row in rows:
        if (
            row.name == LOAD_GUARD_METRIC
            and row.status is Status.REGRESSED
            and (rule.rel is None or growth <= rule.rel)
            and (rule.abs is None or h_q - b_q <= rule.abs)
        ):
            row = with_status(
                row,
                Status.WARN,
                f"fastest steps (p10) moved only {growth:+.0f}%: "
                "more likely machine load than a slower step",
            )
        out.append(row)
    return out


def contention_bound_pp(
    delta: float, base_pct: float, head_pct: float, base_wait: float | None, head_wait: float | None
) -> float:
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
    for wait, pct, contended_side_rises in (
        (head_wait, head_pct, rise),
        (base_wait, base_pct, not rise),
    ):
        if wait is None or wait < CONTENDED_RUNQUEUE_WAIT_PCT:
            continue
        w, share = wait / 100.0, min(max(pct / 100.0, 0.0), 1.0)
        total += 100.0 * w * ((1.0 - share) if contended_side_rises else share) / (1.0 - w)
    return min(total, CONTENTION_MAX_SHIFT_PP)


def contention_guard(rows: list[Row], base: SummaryView, head: SummaryView) -> list[Row]:
    """A share that regressed while either side ran on a contended CPU (runqueue wait at or above
    CONTENDED_RUNQUEUE_WAIT_PCT) is a warning, when the shift is within what the measured
    waits can cause (contention_bound_pp); a larger shift, or one between two quiet runs,
    still regresses."""
    waits = {"base": base.runqueue_wait_pct, "head": head.runqueue_wait_pct}
    contended = {
        s: w for s, w in waits.items() if w is not None and w >= CONTENDED_RUNQUEUE_WAIT_PCT
    }
    if not contended:
        return rows
    if len(contended) == 2:
        note = (
            "both runs ran on contended CPUs: runqueue wait "
            f"{contended['base']:.0f} % (base), {contended['head']:.0f} % (head)"
        )
    else:
        ((side, wait),) = contended.items()
        note = f"{side} ran on a contended CPU: runqueue wait {wait:.0f} %"
    out = []
    for row in rows:
        phase = row.name.removeprefix("step_time.").removesuffix("_pct")
        if (
            phase in PHASES
            and row.status is Status.REGRESSED
            and row.delta is not None
            and isinstance(row.base, float)
            and isinstance(row.head, float)
            and abs(row.delta)
            <= contention_bound_pp(row.delta, row.base, row.head, waits["base"], waits["head"])
        ):
            row = with_status(row, Status.WARN, note)
        out.append(row)
    return out


def name_modules(
    rows: list[Row], base: SummaryView, head: SummaryView, noise_factor: float
) -> tuple[list[Row], list[str]]:
    """A forward or backward share that regressed or warns says which sampled modules moved
    (gate/timing/modules.py); where the phase held still, modules that moved within it beyond their
    noise are a line of context. Module times are sampled: they never decide a verdict."""
    out, context = [], []
    for row in rows:
        phase = row.name.removeprefix("step_time.").removesuffix("_pct")
        if phase in MODULE_PHASES and row.name == f"step_time.{phase}_pct":
            if row.status in (Status.REGRESSED, Status.WARN):
                movers = module_movers(base, head, phase, noise_factor)
                # Both ways: the modules that moved the way the phase did, then those whose
                # own time moved against it (a share the phase's growth only diluted is not).
                same_way = [m for m in movers if row.delta is not None and m[1] * row.delta > 0]
                own = dict(module_movers(base, head, phase, noise_factor, undiluted=True))
                other_way = [
                    m
                    for m in movers
                    if row.delta is not None
                    and m[1] * row.delta < 0
                    and own.get(m[0], 0.0) * m[1] > 0
                ]
                if not same_way and not other_way:
                    out.append(row)
                    continue
                named = describe_movers(same_way + other_way, head=head, phase=phase)
                row = with_status(row, row.status, f"{row.note}; {named}" if row.note else named)
            else:
                # The phase held: did time move between its modules? (Shares of the phase: a
                # phase that only lost share to another one moves none of its modules.)
                inside = module_movers(
                    base,
                    head,
                    phase,
                    noise_factor,
                    of_step=False,
                    least_pp=MIN_MOVE_WITHIN_PP,
                )
                if inside:
                    context.append(
                        f"time moved within {phase} (sampled modules, for "
                        f"information): "
                        f"{describe_movers(inside, head=head, phase=phase)}"
                    )
        out.append(row)
    return out, context


def label_jitter_exemption(rows: list[Row]) -> list[Row]:
    """The step-time label is a function of the shares: if it flipped while no share
    regressed (moved beyond its tolerance and the noise), the run sits on a diagnosis
    threshold, and the flip is only a warning."""
    pct_rows = [
        r for r in rows if r.name.startswith("step_time.") and r.name.endswith("_pct") and r.gating
    ]
    if not pct_rows or any(r.status is Status.REGRESSED for r in pct_rows):
        return rows
    if any(r.status in (Status.NEW, Status.MISSING) for r in pct_rows):
        return rows
    return [
        with_status(
            r, Status.WARN, "label crossed a diagnosis threshold while no phase share regressed"
        )
        if r.name == "step_time.diagnosis" and r.status is Status.REGRESSED
        else r
        for r in rows
    ]
