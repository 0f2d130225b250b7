"""The live view: snapshots (traceml_ci.summary.live) rendered for a terminal (rich) or as one
plain progress line for logs. Used by ``traceml-ci run`` and ``traceml-ci watch``.

Text that comes from a snapshot (run names, hosts, hints) is data: it is escaped for the
terminal and never read as rich markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from traceml_ci.gate import fmt
from traceml_ci.summary.keys import PHASES

#: Short phase names for the plain progress line.
PHASE_ABBREV = {"dataloader": "dl", "forward": "fwd", "backward": "bwd", "optimizer": "opt",
                "other": "other"}


def _pct(value: Any) -> str:
    return f"{value:.0f}%" if isinstance(value, (int, float)) else "-"


def plain_progress_line(snapshots: Sequence[Mapping[str, Any]]) -> str:
    """One line for CI logs and pipes, no escape codes:
    ``traceml-ci: step 1200 · 14.2 steps/s · dl 47% fwd 31% bwd 18% opt 4% · INPUT_BOUND``.
    Several ranks: rank 0's split, the slowest rank's step count."""
    if not snapshots:
        return "traceml-ci: waiting for the first steps"
    lead = snapshots[0]
    window = lead.get("window") or {}
    pct = window.get("pct") or {}
    split = " ".join(f"{PHASE_ABBREV[p]} {_pct(pct.get(p))}" for p in PHASES if p != "other")
    rate = lead.get("steps_per_s")
    rate_text = f"{rate:.1f} steps/s" if isinstance(rate, (int, float)) else "- steps/s"
    steps = min(int(s.get("steps_done") or 0) for s in snapshots)
    label = (lead.get("diagnosis") or {}).get("kind") or "-"
    ranks = f" · {len(snapshots)} ranks" if len(snapshots) > 1 else ""
    return fmt.plain(f"traceml-ci: step {steps} · {rate_text} · {split} · {label}{ranks}")


def render_frame(snapshots: Sequence[Mapping[str, Any]], *, now: float,
                 width: int = 100) -> Any:
    """The rich renderable of one frame of the view (``now``: wall-clock time, for stale
    heartbeats). Minimal for now; the full view is built in docs/live.md's terms."""
    from rich.text import Text

    return Text(plain_progress_line(snapshots))
