"""What a comparison says about the two runs as a whole, not about one row: their environments,
a mapping from another tool, whether they can be compared at all (world size, steps analysed),
missing noise estimates, CPU contention, a changed FLOP count, how the head run ended, and how
each run is named. Lines of context for ``Comparison.notes``; rows are judged elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceml_ci.gate import fmt
from traceml_ci.gate.rules import Rules
from traceml_ci.summary.keys import CONTENDED_RUNQUEUE_WAIT_PCT
from traceml_ci.summary.view import SummaryLike, SummaryView, as_view

#: FLOP counts of one model and input shape agree to the FLOP; beyond this relative change the
#: work itself changed.
FLOPS_CHANGED = 0.001


def _torch_major(version: Any) -> str | None:
    if not isinstance(version, str) or not version:
        return None
    head = version.split(".", 1)[0]
    return head if head.isdigit() else None


def env_differences(
    base: SummaryLike, head: SummaryLike
) -> list[str]:
    """What makes absolute times and memory of two runs incomparable: device type, GPU model,
    torch major version. A field unknown on either side is not a difference."""
    b, h = as_view(base).env, as_view(head).env
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


def environment_notes(diffs: list[str], skip_env: bool) -> list[str]:
    """The line saying how environment differences ``diffs`` were handled, if there are any."""
    if diffs and skip_env:
        return [
            "environments differ (" + "; ".join(diffs) + "): absolute times and memory are "
            "skipped, phase shares still compared (--allow-env-mismatch compares all)"
        ]
    if diffs:
        return ["environments differ (" + "; ".join(diffs) + "); compared anyway"]
    return []


def mapping_notes(side: str, summary: SummaryView) -> list[str]:
    """What a summary mapped from another tool (traceml-ai) could not carry over."""
    mapped = summary.mapped_from
    if mapped is None:
        return []
    tool = mapped.get("tool", "another tool")
    version = mapped.get("schema_version", "?")
    unmapped = mapped.get("unmapped") or []
    notes = mapped.get("notes") or []
    text = f"{side} was mapped from {tool} (schema {version})"
    if unmapped:
        text += "; not mapped: " + ", ".join(str(u) for u in unmapped)
    if notes:
        text += "; " + "; ".join(str(n) for n in notes)
    return [text]


def incomparable_notes(base: SummaryView, head: SummaryView, rules: Rules) -> list[str]:
    """Why the two runs cannot be compared at all, else nothing: different world sizes (unless
    the rules allow it), or a side that analysed no steps."""
    b_world, h_world = base.world_size, head.world_size
    if b_world != h_world and not rules.allow_world_size_change:
        return [
            f"world size {b_world} → {h_world}: runs over different numbers of ranks "
            "are not compared (rules: allow_world_size_change = true compares them)"
        ]
    # A run that measured nothing (killed before its first steps, torch never imported, fewer
    # steps than its warmup) has no figure to pass or fail: never a silent pass.
    return [
        f"{side} analysed no steps ({v.run_status or 'status unknown'}, "
        f"{v.steps_total or 0} steps in all, {v.warmup_steps or 0} of them warmup): "
        "it measured nothing to compare"
        for side, v in (("base", base), ("head", head))
        if v.steps_analyzed == 0
    ]


def measurement_notes(base: SummaryView, head: SummaryView, rules: Rules) -> list[str]:
    """What limits the judging: a side without a noise estimate, a side on a contended CPU."""
    notes: list[str] = []
    missing_noise = [s for s, v in (("base", base), ("head", head)) if not v.has_noise]
    if missing_noise and rules.noise_factor > 0:
        notes.append(
            f"no noise estimate in {' and '.join(missing_noise)} (too few steps, or not recorded)"
            ": the noise rule uses what the other side reports, else tolerances alone"
        )
    for side, v in (("base", base), ("head", head)):
        wait = v.runqueue_wait_pct
        # on a host clock the shares inform and fail only past their band: nothing to excuse
        if wait is not None and wait >= CONTENDED_RUNQUEUE_WAIT_PCT and not (
            base.host_clock or head.host_clock
        ):
            notes.append(
                f"{side} ran on a contended CPU (runqueue wait {wait:.0f} %): share "
                "shifts it can explain only warn"
            )
    return notes


def headline_rank_notes(base: SummaryView, head: SummaryView) -> list[str]:
    """Two merged DDP summaries whose step split is not the same rank's (the rank the others
    wait for changed): their shares compare two ranks -- a wait share that fell is the new
    critical path's, not a faster all-reduce. Said, not judged."""
    ranks = []
    for v in (base, head):
        r = v.at(("distributed", "headline_rank"))
        ranks.append(r if isinstance(r, int) and not isinstance(r, bool) else None)
    b, h = ranks
    if b is None or h is None or b == h:
        return []
    return [
        f"the job's step split is rank {b}'s in base and rank {h}'s in head (the rank the "
        "others wait for changed): shares compare two ranks; each rank's split is in its row"
    ]


def flops_context(base: SummaryView, head: SummaryView) -> list[str]:
    """A changed FLOP count per step means the model or its input shapes changed: say so, as
    context for every share that moved (information, never a verdict)."""
    b = base.efficiency.get("flops_per_step")
    h = head.efficiency.get("flops_per_step")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (b, h)):
        return []
    if abs(h - b) <= FLOPS_CHANGED * b:
        return []
    change = 100.0 * (h - b) / b
    return [
        f"FLOPs per step changed {fmt.flops(b)} → {fmt.flops(h)} ({change:+.1f} %): "
        "the model or its input shapes changed, not only how fast it runs"
    ]


def head_status_notes(head: SummaryView) -> list[str]:
    """A head run that did not complete: its figures may cover only part of it."""
    status = head.run_status
    if status in (None, "completed"):
        return []
    return [f"head run {status}: its figures may cover only part of the run"]


def run_name(v: SummaryView) -> str:
    """How a run is named in reports: its name, and how many runs a combined summary holds."""
    count = v.repeats_count
    if count is None:
        return v.run_name
    return f"{v.run_name} (×{count} run{'' if count == 1 else 's'})"


def distributed_block(v: SummaryView) -> Mapping[str, Any] | None:
    """A run's ``distributed`` block, for the renderers' per-rank section; None for one process."""
    block = v.at(("distributed",))
    return block if isinstance(block, Mapping) else None
