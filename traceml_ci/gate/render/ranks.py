"""A merged summary's ``distributed`` block as text: the per-rank table's headers and rows, whose
split heads the job, and the straggler line with what to look at next. Unescaped strings: each
medium escapes them (gate/fmt.py), as gate/render/comparison.py and ``traceml-ci show`` do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceml_ci.summary.keys import H2D_PHASE, WAIT_PHASE, phases_in

#: A phase's column in a terminal's per-rank table.
_PHASE_SHORT = {"dataloader": "data", H2D_PHASE: "h2d", "forward": "fwd", "backward": "bwd",
                WAIT_PHASE: "wait",
                "optimizer": "opt", "other": "other"}


def rank_phases(block: Mapping[str, Any]) -> tuple[str, ...]:
    """The phases of a ``distributed`` block's per-rank table: with the wait phase where its
    ranks have one (then backward is backward's compute)."""
    rows = [r for r in block.get("ranks") or [] if isinstance(r, Mapping)]
    return phases_in({p for r in rows for p in (r.get("pct") or {})})


def rank_headers(block: Mapping[str, Any], *, short: bool = False) -> list[str]:
    """The per-rank table's headers for ``block``: a column per phase, the wait phase's where
    its ranks have one; ``short``: abbreviated for a terminal."""
    phases = rank_phases(block)
    if short:
        return ["rank", "node", "host", "status", "step ms", "own ms",
                *(f"{_PHASE_SHORT[p]} %" for p in phases), "peak MB", ""]
    return ["rank", "node", "host", "status", "step ms", "own work ms",
            *(f"{p} %" for p in phases), "peak MB", ""]


def headline_line(block: Mapping[str, Any]) -> str:
    """Whose step split heads a merged summary (unescaped); empty for older summaries."""
    head = block.get("headline_rank")
    if isinstance(head, bool) or not isinstance(head, int):
        return ""
    s = block.get("straggler") or {}
    why = ("the straggler, whom the others wait for" if s.get("rank") == head
           else "the critical path: the rank the others wait for" if s.get("evidence") == "wait"
           else "the rank with the most own work")
    return (f"The job's step split is rank {head}'s ({why}); ranks differ, "
            "each rank's split is in its row.")
STRAGGLER_MARK = "◀ straggler"


def _num(value: Any, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) else "—"


def rank_rows(block: Mapping[str, Any]) -> list[list[str]]:
    """The per-rank table of a summary's ``distributed`` block, as unescaped strings in
    ``rank_headers`` order; the straggler's row marked. Each medium escapes the cells."""
    straggler = (block.get("straggler") or {}).get("rank")
    phases = rank_phases(block)
    rows = []
    for r in block.get("ranks") or []:
        if not isinstance(r, Mapping):
            continue
        pct = r.get("pct") or {}
        rows.append([
            str(r.get("rank", "?")), str(r.get("node_rank", "—")), str(r.get("host") or "—"),
            str(r.get("status") or "—"), _num(r.get("step_ms_median"), 2),
            _num(r.get("own_work_ms"), 2), *(_num(pct.get(p)) for p in phases),
            _num(r.get("peak_mb")),
            STRAGGLER_MARK if straggler is not None and r.get("rank") == straggler else "",
        ])
    return rows


def straggler_line(block: Mapping[str, Any]) -> str:
    """One unescaped line: the ranks reported and failed, the straggler label, its rank, score
    and cause."""
    from traceml_ci.summary.ranks import BALANCED

    s = block.get("straggler") or {}
    world, reported = block.get("world_size", "?"), block.get("ranks_reported", "?")
    head = f"{reported}/{world} ranks reported"
    if block.get("failed_ranks"):
        head += ", failed: " + ", ".join(str(x) for x in block["failed_ranks"])
    label = s.get("label")
    if label is None:
        return f"{head}; too few ranks timed to compare"
    if label == BALANCED:
        # Say what the number is: the most any rank's own work per step exceeds the others'
        # median (it can pass the threshold and still be balanced: a sliver of the step, or
        # within its extra CPU contention).
        line = (f"{head}; {label} (straggler threshold {_num(s.get('threshold_pct'), 0)} % "
                f"more own work per step than the others' median; the most any rank does: "
                f"{_num(s.get('score_pct'))} % more)")
        return line + _transfer(block)
    late = s.get("lateness_ms")
    waited = (f"; the others wait {_num(late, 2)} ms per step for it"
              if isinstance(late, (int, float)) else "")
    return (f"{head}; {label}: rank {s.get('rank')} +{_num(s.get('score_pct'))} % own work per "
            f"step over the others' median, mostly {s.get('cause') or 'unknown'}{waited}"
            f"{_transfer(block)}")


def _transfer(block: Mapping[str, Any]) -> str:
    """The collectives' own time, beside the waiting (empty for older summaries)."""
    t = block.get("transfer_ms")
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        return ""
    return f"; collectives take {_num(t, 2)} ms per step without waiting (the least any rank waits)"


def straggler_next_step(block: Mapping[str, Any]) -> str:
    """What to look at for the block's straggler label (unescaped); empty when none."""
    from traceml_ci.summary.ranks import NEXT_STEP

    s = block.get("straggler") or {}
    text = NEXT_STEP.get(str(s.get("label")), "")
    return text.format(rank=s.get("rank"), cause=s.get("cause") or "other") if text else ""
