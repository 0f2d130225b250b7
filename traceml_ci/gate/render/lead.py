"""The two lines a report leads with: what decided the verdict, and what the timings show.

On a CPU runner the counts and settings decide and the host-clock timings only inform
(docs/gate.md, "The rule"); a reader must see which is which before any table. Pure: a
Comparison (or a set of them) in, plain strings out; each renderer escapes them for its medium.
"""

from __future__ import annotations

from collections.abc import Iterable

from traceml_ci.gate import fmt
from traceml_ci.gate.judging import HOST_BAND_CPU_PCT, HOST_BAND_SHARE_PP
from traceml_ci.gate.results import Comparison, Evidence, Row, SetComparison, Status
from traceml_ci.summary.keys import ALL_PHASES

#: How the decisive evidence is named, in this order.
_KINDS = (
    (Evidence.COUNT, "counts"),
    (Evidence.SETTING, "settings"),
    (Evidence.MEMORY, "memory"),
    (Evidence.DEVICE_CLOCK, "device-clock timings"),
    (Evidence.DEVICE, "device figures"),
)
#: Shares named in the timings line: the largest moves, at most this many ...
SHARES_NAMED = 3
#: ... and only those that moved at least this much (pp).
SHARE_NAMED_PP = 0.5
#: What a host clock's band is, in words.
BAND_WORDS = (f"fail alone only past +{HOST_BAND_SHARE_PP:g} pp of a share or "
              f"{1 + HOST_BAND_CPU_PCT / 100:g}x the CPU time per step")


def _decisive(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.gating and r.evidence is not Evidence.HOST_CLOCK]


def _kinds(rows: list[Row]) -> str:
    present = {r.evidence for r in rows}
    names = [name for kind, name in _KINDS if kind in present]
    if len(names) < 2:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def _tally(rows: list[Row]) -> str:
    judged = [r for r in rows if r.status not in (Status.NEW,)]
    counts = {s: sum(1 for r in judged if r.status is s) for s in Status}
    moved = [f"{counts[s]} {s.value}" for s in (Status.REGRESSED, Status.MISSING,
                                                  Status.WARN, Status.IMPROVED) if counts[s]]
    if not moved:
        return f"all {len(judged)} unchanged"
    return ", ".join(moved) + f" of {len(judged)}"


def decided_line(c: Comparison) -> str:
    """``Decided by counts, settings and memory: all 12 unchanged`` (empty when no row of
    them has a value on both sides)."""
    rows = _decisive(c.rows)
    if not rows:
        return ""
    return f"Decided by {_kinds(rows)}: {_tally(rows)}"


def _host_rows(c: Comparison) -> dict[str, Row]:
    return {r.name: r for r in c.rows if r.evidence is Evidence.HOST_CLOCK}


def timings_line(c: Comparison) -> str:
    """``Timings (host clock: they inform, ...): step 20.0 → 26.0 ms (+30%); dataloader
    +2.1 pp, forward −1.0 pp`` -- empty unless the runs were timed on a host clock."""
    said = timings_said(c)
    return f"Timings (host clock: they inform, and {BAND_WORDS}): {said}" if said else ""


def timings_said(c: Comparison) -> str:
    """What a host clock's timings show: the step time, the largest share moves, and what
    went past its band ("" unless the runs were timed on a host clock)."""
    rows = _host_rows(c)
    if not rows:
        return ""
    said = []
    step = rows.get("step_time.step_ms.median")
    if step is not None and isinstance(step.base, float) and isinstance(step.head, float):
        said.append(f"step {fmt.value(step.base, step.unit)} → {fmt.value(step.head, step.unit)}"
                    f" ({fmt.delta(step.delta, step.delta_unit)})")
    shares = [rows[f"step_time.{p}_pct"] for p in ALL_PHASES if f"step_time.{p}_pct" in rows]
    moved = sorted((r for r in shares if r.delta is not None and abs(r.delta) >= SHARE_NAMED_PP),
                   key=lambda r: -abs(r.delta or 0.0))
    if moved:
        said.append(", ".join(
            f"{r.name.removeprefix('step_time.').removesuffix('_pct')} "
            f"{fmt.delta(r.delta, r.delta_unit)}" for r in moved[:SHARES_NAMED]))
    elif shares:
        said.append(f"every share within ±{SHARE_NAMED_PP:g} pp")
    past = [r.name for r in rows.values() if r.status is Status.REGRESSED]
    tail = f"; past the band: {', '.join(past)}" if past else ""
    return "; ".join(said) + tail


def set_lines(c: SetComparison) -> list[str]:
    """A set's two lines: what decided over every key, and the largest timing moves."""
    items = list(c.items.items())
    decisive = [r for _, item in items for r in _decisive(item.rows)]
    out = []
    if decisive:
        changed = sum(1 for _, item in items
                      if any(r.status is not Status.OK for r in _decisive(item.rows)))
        what = "unchanged in every key" if not changed else f"changed in {changed} of {len(items)}"
        out.append(f"Decided by {_kinds(decisive)}: {what}")
    step_moves = []
    share_moves = []
    for key, item in items:
        rows = _host_rows(item)
        step = rows.get("step_time.step_ms.median")
        if step is not None and step.delta is not None:
            step_moves.append((abs(step.delta), key, step))
        for p in ALL_PHASES:
            r = rows.get(f"step_time.{p}_pct")
            if r is not None and r.delta is not None:
                share_moves.append((abs(r.delta), key, p, r))
    if step_moves or share_moves:
        said = []
        if step_moves:
            _, key, r = max(step_moves, key=lambda m: m[0])
            said.append(f"largest step-time move {fmt.delta(r.delta, r.delta_unit)} ({key})")
        if share_moves:
            _, key, p, r = max(share_moves, key=lambda m: m[0])
            said.append(f"largest share move {p} {fmt.delta(r.delta, r.delta_unit)} ({key})")
        out.append(f"Timings (host clock: they inform, and {BAND_WORDS}): " + "; ".join(said))
    return out


def lead_lines(c: Comparison | SetComparison) -> list[str]:
    """The lines a report leads with (each plain text from summaries: escape it)."""
    if isinstance(c, SetComparison):
        return set_lines(c)
    return [x for x in (decided_line(c), timings_line(c)) if x]
