"""How a counter's row is made and said: the row itself (``counter_row``), a count read from
a summary, the sites and phases that moved, sizes in bytes. Shared by gate/counted/counters.py
and gate/counted/guide.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceml_ci.gate.metrics import Kind
from traceml_ci.gate.results import COUNTERS_PREFIX, Evidence, Row, Status, Tolerance
from traceml_ci.gate.rules import Direction, Rule
from traceml_ci.summary.view import finite

#: Row names start with this.
PREFIX = COUNTERS_PREFIX
#: Sites (and modules) named in a note (the largest changes first).
SITES_NAMED = 3
#: A count compared exactly: any rise regresses.
EXACT = Rule(abs=0.0, direction=Direction.WORSE)


def counter_row(
    name: str,
    b: Any,
    h: Any,
    delta: float | None,
    rule: Rule | None,
    kind: Kind,
    unit: str,
    delta_unit: str,
    worse: bool,
    better: bool,
    cause: str,
    why: str = "",
    evidence: Evidence = Evidence.COUNT,
) -> Row:
    """A counter's row; its note is ``cause`` and then ``why`` (empty when nothing changed)."""
    status = Status.REGRESSED if worse else Status.IMPROVED if better else Status.OK
    tol = Tolerance(rule, kind, unit) if rule is not None else None
    note = cause + why if cause else ""
    return Row(PREFIX + name, b, h, delta, tol, status, unit, delta_unit, None, note, cause,
               evidence)


def count(x: Any) -> int | None:
    """A summary's number as a count (None: missing or not a number)."""
    v = finite(x)
    return None if v is None else int(v)


def sites_of(block: Mapping[str, Any], key: str, value: str) -> dict[tuple[str, str], int]:
    """(line, op) -> ``value`` of a block's listed sites (``key``: the list's name)."""
    out: dict[tuple[str, str], int] = {}
    items = block.get(key)
    for s in items if isinstance(items, list) else ():
        if isinstance(s, Mapping) and isinstance(s.get("at"), str):
            n = count(s.get(value))
            if n is not None:
                out[(str(s["at"]), str(s.get("op") or "?"))] = n
    return out


def plural(n: int, word: str) -> str:
    """``1 scalar read``, ``2 scalar reads``."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def phase_moves(b: Any, h: Any, index: int | None = None) -> str:
    """`` in optimizer +8, backward +2``: the phases whose figure moved, the largest first
    (``index``: of a ``[count, bytes]`` pair); "" when either side has none."""
    if not isinstance(b, Mapping) or not isinstance(h, Mapping):
        return ""

    def at(block: Mapping[str, Any], phase: str) -> int:
        v = block.get(phase)
        if index is not None:
            v = v[index] if isinstance(v, list) and len(v) > index else None
        return count(v) or 0

    moves = sorted(((at(h, p) - at(b, p), p) for p in set(b) | set(h)),
                   key=lambda m: (-abs(m[0]), m[1]))
    said = [f"{p} {d:+d}" for d, p in moves if d]
    return f" in {', '.join(said)}" if said else ""


def byte_size(n: float) -> str:
    """``1.21 kB``: three digits, decimal units."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def top_at(block: Mapping[str, Any], key: str = "sites") -> str:
    """`` at file:line`` of a block's first listed site ("" when none)."""
    top = block.get(key)
    first = top[0] if isinstance(top, list) and top and isinstance(top[0], Mapping) else {}
    return f" at {first['at']}" if isinstance(first.get("at"), str) else ""
