"""Which sampled submodules moved between base and head (summary ``modules``): the pointer
beside a phase share that moved, never a verdict of its own (module times are sampled).

A module's move is in pp of the *step*: its share of the phase × the phase's share of the step,
so "encoder.layer.3 +7.6 pp" reads against "forward +8.1 pp". The noise rule is the phases':
a move counts only beyond ``noise_factor`` × the combined per-sample spread both summaries
report for that module (and at least ``MIN_MOVE_PP``). Times are inclusive, so a parent moves
with its child: a parent whose move one of its descendants explains is left for the child.
Every module that moved is named, both ways: time that moved from ``layers.3`` to ``layers.1``
names both. A module that moved against its phase is named only when its own time moved
(``undiluted``), not when only the others' growth shrank its share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from traceml_ci.summary.keys import TOP_MODULES
from traceml_ci.summary.view import SummaryView, as_view, finite, module_label

#: Phases whose shares are split by module.
MODULE_PHASES = ("forward", "backward")
#: A module is named beside a phase that moved only when its step share moved at least this
#: much (pp).
MIN_MOVE_PP = 0.5
#: Within a phase that held still, a module's share of the phase must move at least this much
#: (pp, as a phase share's default tolerance) to be said: smaller moves are chatter.
MIN_MOVE_WITHIN_PP = 5.0
#: A parent is left out when a descendant moved by at least this fraction of its move.
CHILD_EXPLAINS = 0.75
#: Modules named beside a phase share that moved (the largest movers first; None: all).
MODULES_NAMED: int | None = None


def _listed(doc: SummaryView, phase: str, of_step: bool
            ) -> tuple[dict[str, tuple[float, float]], bool]:
    """name -> (share, noise) in pp of the step (``of_step``) or of the phase, for one phase's
    listed modules; and whether the list may have been cut (more were timed than listed)."""
    share = doc.share(phase) if of_step else 100.0
    rows = _rows(doc, phase)
    if share is None or not rows:
        return {}, False
    out: dict[str, tuple[float, float]] = {}
    for name, m in rows.items():
        pct = finite(m.get("share_pct"))
        if pct is not None:
            noise = finite(m.get("noise_pp")) or 0.0
            out[name] = (pct * share / 100.0, noise * share / 100.0)
    return out, len(rows) >= TOP_MODULES


def module_movers(base: SummaryView | Mapping[str, Any], head: SummaryView | Mapping[str, Any],
                  phase: str = "forward",
                  noise_factor: float = 1.0, *, of_step: bool = True,
                  least_pp: float = MIN_MOVE_PP, undiluted: bool = False
                  ) -> list[tuple[str, float]]:
    """Sampled modules of ``phase`` whose share of the step (``of_step``; else of the phase)
    moved beyond their noise, in pp, the largest first; a parent whose move a descendant
    explains is left out. ``undiluted``: base's shares are first scaled to head's step (or
    phase) length, so a module moves only when its own time did -- not when the step grew
    around it (None when a length is missing: nothing moves)."""
    base_v, head_v = as_view(base), as_view(head)
    b, b_cut = _listed(base_v, phase, of_step)
    h, h_cut = _listed(head_v, phase, of_step)
    if not b or not h:
        return []
    if undiluted:
        ratio = _length_ratio(base_v, head_v, phase, of_step)
        if ratio is None:
            return []
        b = {name: (share * ratio, noise * ratio) for name, (share, noise) in b.items()}
    # A module listed on one side only was below the other side's shortest entry (if that list
    # was cut): take that entry as its share, which understates the move, never overstates it.
    b_floor = min(s for s, _ in b.values()) if b_cut else None
    h_floor = min(s for s, _ in h.values()) if h_cut else None
    moved: dict[str, float] = {}
    for name in set(b) | set(h):
        bs, bn = b.get(name, (b_floor, 0.0))
        hs, hn = h.get(name, (h_floor, 0.0))
        if bs is None or hs is None:
            continue
        delta = hs - bs
        if abs(delta) >= max(least_pp, noise_factor * math.hypot(bn, hn)):
            moved[name] = delta
    kept = [(name, d) for name, d in moved.items() if not _explained_by_child(name, d, moved)]
    return sorted(kept, key=lambda kv: -abs(kv[1]))


def _length_ratio(base: SummaryView, head: SummaryView, phase: str, of_step: bool
                  ) -> float | None:
    """base's step (or phase) ms over head's: what a base share is of head's length."""
    if of_step:
        b, h = base.step_ms(), head.step_ms()
    else:
        b, h = base.phase_ms(phase), head.phase_ms(phase)
    if b is None or h is None or b <= 0 or h <= 0:
        return None
    return b / h


def _explained_by_child(name: str, delta: float, moved: Mapping[str, float]) -> bool:
    prefix = name + "."
    return any(other.startswith(prefix) and d * delta > 0 and abs(d) >= CHILD_EXPLAINS * abs(delta)
               for other, d in moved.items())


def describe_movers(movers: list[tuple[str, float]], limit: int | None = MODULES_NAMED,
                    head: SummaryView | Mapping[str, Any] | None = None, phase: str = "") -> str:
    """``encoder.layer.3 +7.6 pp (41 % of forward), embed -0.3 pp`` -- with ``head``, each
    module's share of the phase there (names are data: the renderers escape them)."""
    view = as_view(head) if head is not None else None
    shares = _listed(view, phase, of_step=False)[0] if view is not None else {}
    rows = _rows(view, phase) if view is not None else {}
    out = []
    for name, delta in movers[:limit]:
        share = shares.get(name)
        now = f" ({share[0]:.0f} % of {phase})" if share is not None else ""
        label = module_label(rows[name]) if name in rows else name
        out.append(f"{label} {delta:+.1f} pp{now}")
    return ", ".join(out)


def _rows(doc: SummaryView, phase: str) -> dict[str, Mapping[str, Any]]:
    """name -> row of one phase's listed modules (the well-formed ones)."""
    rows = doc.at(("modules", phase))
    if not isinstance(rows, list):
        return {}
    return {m["name"]: m for m in rows
            if isinstance(m, Mapping) and isinstance(m.get("name"), str)}
