"""torch.compile's own counts over a run: graphs compiled, frames compiled (a recompile is one
more), graph breaks and their reasons -- read from ``torch._dynamo.utils.counters`` at the
tracer's start and at its end, the difference being the run's.

Nothing is imported: a run that never touched ``torch._dynamo`` has no block. The counters are
the process's, so what another test in the same pytest process compiled before this run
started is left out by the difference; code compiled once and cached is not compiled again.
"""

from __future__ import annotations

import sys
from typing import Any

#: Graph-break reasons named (the most frequent first), each cut to its first lines.
TOP_BREAKS = 3
REASON_CHARS = 160


def snapshot() -> dict[str, Any] | None:
    """Dynamo's counters now (None: ``torch._dynamo`` not imported)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    counters = getattr(dynamo, "counters", None)
    if counters is None:
        return None
    breaks = counters.get("graph_break") or {}
    return {
        "graphs": int((counters.get("stats") or {}).get("unique_graphs", 0)),
        "frames": int((counters.get("frames") or {}).get("ok", 0)),
        "breaks": {str(k): int(v) for k, v in breaks.items()},
    }


def compile_block(start: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``counters.compile`` block: what was compiled since ``start`` (None: nothing ever
    was, or torch._dynamo was never imported)."""
    now = snapshot()
    if now is None:
        return None
    before = start or {"graphs": 0, "frames": 0, "breaks": {}}
    breaks = {k: n - before["breaks"].get(k, 0) for k, n in now["breaks"].items()}
    breaks = {k: n for k, n in breaks.items() if n > 0}
    out = {"graphs": now["graphs"] - before["graphs"],
           "frames": now["frames"] - before["frames"],
           "graph_breaks": sum(breaks.values())}
    if not (out["graphs"] or out["frames"] or out["graph_breaks"]):
        return None
    top = sorted(breaks.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_BREAKS]
    out["top_breaks"] = [{"reason": _first_line(k), "count": n} for k, n in top]
    return out


def _first_line(reason: str) -> str:
    """The reason's first line, with its ``Explanation:`` line where dynamo gives one (the
    first alone says "Failed to trace builtin operator", the explanation which one)."""
    lines = [x.strip() for x in reason.strip().splitlines() if x.strip()]
    if not lines:
        return "?"
    why = next((x.removeprefix("Explanation:").strip() for x in lines[1:]
                if x.startswith("Explanation:")), "")
    return (f"{lines[0]}: {why}" if why else lines[0])[:REASON_CHARS]
