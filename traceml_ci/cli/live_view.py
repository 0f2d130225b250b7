"""The live view: snapshots (traceml_ci.summary.live) rendered for a terminal (rich) or as one
plain progress line for logs. Used by ``traceml-ci run`` and ``traceml-ci watch``.

Text that comes from a snapshot (run names, hosts, hints) is data: it goes through
``fmt.plain`` (control characters become visible escapes) into rich ``Text`` objects, never
into markup, so ``[bold]``, ESC or ``::error::`` in a run name print as the characters they are.
A snapshot may be old, partial or odd (another writer version, a hand-edited file): every field
is read through the type-checking accessors below, and a missing one shows as ``-``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from traceml_ci.cli.show import SEVERITY_STYLE
from traceml_ci.gate import fmt
from traceml_ci.summary.keys import PHASES, WAIT_PHASE
from traceml_ci.summary.live import ENDED, RUNNING, is_stale
from traceml_ci.summary.model import MemoryLabel, Severity, StepTimeLabel

#: Short phase names for the plain progress line and the "since start" row (a phase not
#: listed goes by its name).
PHASE_ABBREV = {"dataloader": "dl", "forward": "fwd", "backward": "bwd", WAIT_PHASE: "wait",
                "optimizer": "opt", "other": "other"}
#: One colour per phase, the same in the bar, the legend and the per-rank mini-bars: the
#: terminal's own palette colours, distinct ones even on 16 colours (TERM=xterm), where
#: rich brought four hex shades down to the same grey. A phase not listed is white.
PHASE_STYLE = {"dataloader": "yellow", "forward": "bright_blue", "backward": "magenta",
               WAIT_PHASE: "cyan", "optimizer": "green", "other": "bright_black"}
_UNLISTED_STYLE = "white"
#: What a snapshot may name as a phase, and how many it may name: the view shows the phases
#: the window has (``wait`` only where the run used a process group), not a list of its own.
_PHASE_NAME = re.compile(r"[a-z][a-z0-9_]{0,15}")
MAX_PHASES = 10
#: The severity a label has when a snapshot does not carry one (the snapshot format keeps
#: kind, message and next step; the summary's severity of a *_BOUND label depends on the share).
KIND_SEVERITY = {
    StepTimeLabel.INPUT_BOUND.value: Severity.WARN.value,
    StepTimeLabel.H2D_BOUND.value: Severity.WARN.value,
    StepTimeLabel.OVERHEAD_BOUND.value: Severity.WARN.value,
    StepTimeLabel.OPTIMIZER_BOUND.value: Severity.WARN.value,
    StepTimeLabel.COMPUTE_BOUND.value: Severity.INFO.value,
    StepTimeLabel.BALANCED.value: Severity.INFO.value,
    MemoryLabel.MEMORY_GROWTH.value: Severity.WARN.value,
    MemoryLabel.FRAGMENTATION.value: Severity.WARN.value,
    MemoryLabel.HIGH_PRESSURE.value: Severity.CRIT.value,
}
#: Labels that say "not enough data yet": shown dim, and left out of the plain line.
QUIET_KINDS = frozenset({StepTimeLabel.INSUFFICIENT_DATA.value, MemoryLabel.NO_DATA.value})
#: The eight heights of a sparkline, lowest first.
SPARK = "▁▂▃▄▅▆▇█"
#: Columns kept for the sparkline's range label (``  10.42–12.90 ms``).
SPAN_ROOM = 22
#: A move of a phase's share since the start at least this large (percentage points) is bold.
BIG_MOVE_PP = 5.0
#: Longest run name, host or path shown before it is cut (a frame is a few lines, not a dump).
MAX_TEXT = 60
#: Ending statuses, worst first: the one a multi-rank run is reported with.
_WORST_FIRST = ("crashed", "interrupted", "completed")


# --- Reading a snapshot without trusting it -----------------------------------------------

def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    n = _num(value)
    return int(n) if n is not None and abs(n) < 1e18 else None


def _str(value: Any, default: str = "-", limit: int = MAX_TEXT) -> str:
    """``value`` as one safe line of terminal text, cut to ``limit`` characters."""
    if value is None or value == "":
        return default
    s = value if isinstance(value, str) else str(value)
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return fmt.plain(s)


def _kind(diag: Any) -> str | None:
    kind = _map(diag).get("kind")
    return kind if isinstance(kind, str) and kind else None


def _label_style(diag: Any) -> str:
    d = _map(diag)
    kind = _kind(d)
    if kind in QUIET_KINDS:
        return "dim"
    severity = d.get("severity")
    if not isinstance(severity, str) or severity not in SEVERITY_STYLE:
        severity = KIND_SEVERITY.get(kind or "", Severity.INFO.value)
    return "bold " + SEVERITY_STYLE[severity].replace("bold ", "")


def _pcts(snapshot: Mapping[str, Any]) -> dict[str, float | None]:
    """The window's share of each of its phases, in the order it gives them (the summary's
    display order); the five every summary has, unknown, where it gives none (an old or
    partial snapshot)."""
    pct = _map(_map(snapshot.get("window")).get("pct"))
    phases = [p for p in pct if isinstance(p, str) and _PHASE_NAME.fullmatch(p)][:MAX_PHASES]
    return {p: _num(pct.get(p)) for p in phases or PHASES}


def _abbrev(phase: str) -> str:
    return PHASE_ABBREV.get(phase, phase)


def _style(phase: str) -> str:
    return PHASE_STYLE.get(phase, _UNLISTED_STYLE)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} MB"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def _status(snapshot: Mapping[str, Any]) -> str | None:
    status = snapshot.get("status")
    return status if isinstance(status, str) else None


def run_ended(snapshots: Sequence[Mapping[str, Any]]) -> bool:
    """Every rank has written its final snapshot (a status other than running)."""
    return bool(snapshots) and all(_status(s) in ENDED for s in snapshots)


def ending(snapshots: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """How the run ended (the worst rank's status) and its summary path (the lead's, else any
    rank's), for ``traceml-ci: run ended (<status>); summary: <path>``."""
    statuses = {_status(s) for s in snapshots}
    status = next((s for s in _WORST_FIRST if s in statuses), "ended")
    paths = [s.get("summary_path") for s in snapshots]
    path = next((p for p in paths if isinstance(p, str) and p), None)
    return status, path


def ending_line(snapshots: Sequence[Mapping[str, Any]]) -> str:
    """``traceml-ci: run ended (completed); summary: traceml-out/final_summary.json``."""
    status, path = ending(snapshots)
    where = _str(path, "(not written)", limit=1000)
    return f"traceml-ci: run ended ({_str(status)}); summary: {where}"


def stale_ranks(snapshots: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    """The ranks (as shown) whose heartbeat went stale."""
    return [_str(s.get("rank"), "?") for s in snapshots if is_stale(s, now)]


# --- Ranks labelled as the final summary labels them ---------------------------------------

def rank_straggler(snapshots: Sequence[Mapping[str, Any]],
                   now: float | None = None) -> tuple[str, int] | None:
    """The straggler the final summary would name, from the ranks' windows: summary/ranks.py's
    own rule (``analyse``: the rank the others wait for, by the wait phase where the ranks have
    it) over each snapshot's window summary, as ``(label, rank)``. None with fewer than two
    ranks to compare, balanced ranks, or windows an old writer left out; with ``now``, ranks
    whose heartbeat went stale are left out (their window is old)."""
    from traceml_ci.summary.ranks import BALANCED, analyse

    docs, seen = [], set()
    for snap in snapshots:
        rank, window = snap.get("rank"), snap.get("window_summary")
        if (isinstance(rank, bool) or not isinstance(rank, int) or rank in seen
                or not isinstance(window, Mapping)
                or (now is not None and is_stale(snap, now))):
            continue
        seen.add(rank)
        # The rank as the snapshot says, whatever the window's own run block holds.
        docs.append({**window, "run": {**_map(window.get("run")), "rank": rank}})
    if len(docs) < 2:
        return None
    analysis = analyse(docs)[1]
    label, rank = analysis.get("label"), analysis.get("rank")
    if not isinstance(label, str) or label == BALANCED or not isinstance(rank, int):
        return None
    return label, rank


def _rank_label(snapshot: Mapping[str, Any], straggler: tuple[str, int] | None,
                stale: bool) -> Any:
    """A rank's label in the ranks table: the straggler's label on the rank the others wait
    for and ``waits for rank N`` on the others (their window's own label would describe the
    waiting, e.g. COMPUTE_BOUND for a wait inside backward); else, and on a ``stale`` rank
    (left out of the comparison), the window's own label."""
    from rich.text import Text

    if straggler is not None and not stale:
        label, who = straggler
        if snapshot.get("rank") == who:
            return Text(_str(label, limit=40),
                        style=_label_style({"kind": label, "severity": Severity.WARN.value}))
        return Text(f"waits for rank {who}", style="dim")
    kind = _kind(snapshot.get("diagnosis"))
    return Text(_str(kind, limit=40), style=_label_style(snapshot.get("diagnosis")) if kind
                else "dim")


# --- The plain line -----------------------------------------------------------------------

def _pct(value: float | None) -> str:
    return f"{value:.0f}%" if value is not None else "-"


def plain_progress_line(snapshots: Sequence[Mapping[str, Any]], *,
                        now: float | None = None) -> str:
    """One line for CI logs and pipes, no escape codes:
    ``traceml-ci: step 1200 · 14.2 steps/s · dl 47% fwd 31% bwd 18% opt 4% · INPUT_BOUND``.
    Several ranks: rank 0's split, the slowest rank's step count, and the straggler (label and
    rank) where the final summary's rule names one (``rank_straggler``). The memory label is added
    when it says something (not BALANCED, not NO_DATA); with ``now`` (wall-clock seconds),
    ranks whose heartbeat went stale are named."""
    if not snapshots:
        return "traceml-ci: waiting for the first steps"
    lead = snapshots[0]
    pct = _pcts(lead)
    split = " ".join(f"{_abbrev(p)} {_pct(v)}" for p, v in pct.items() if p != "other")
    rate = _num(lead.get("steps_per_s"))
    rate_text = f"{rate:.1f} steps/s" if rate is not None else "- steps/s"
    counts = [c for c in (_int(s.get("steps_done")) for s in snapshots) if c is not None]
    steps = str(min(counts)) if counts else "-"
    parts = [f"traceml-ci: step {steps}", rate_text, split,
             _str(_kind(lead.get("diagnosis")))]
    straggler = rank_straggler(snapshots, now)
    if straggler is not None:
        parts.append(f"{_str(straggler[0], limit=40)} rank {straggler[1]}")
    mem = _kind(lead.get("memory_diagnosis"))
    if mem and mem != MemoryLabel.BALANCED.value and mem not in QUIET_KINDS:
        parts.append(f"memory {_str(mem)}")
    if len(snapshots) > 1:
        parts.append(f"{len(snapshots)} ranks")
    if now is not None:
        stale = stale_ranks(snapshots, now)
        if stale:
            parts.append(f"STALE heartbeat: rank {', '.join(stale)}")
    if run_ended(snapshots):
        parts.append(f"ended ({ending(snapshots)[0]})")
    return " · ".join(parts)


# --- The rich frame -----------------------------------------------------------------------

def sparkline(values: Sequence[Any], width: int | None = None) -> str:
    """``values`` (numbers; others skipped) as block heights, lowest to highest of the series;
    with ``width``, only the last ``width`` values. (Eight characters of arithmetic: no library
    for it is worth a dependency.)"""
    nums = [v for v in (_num(x) for x in values) if v is not None]
    if width is not None:
        nums = nums[-width:] if width > 0 else []
    if not nums:
        return ""
    lo, hi = min(nums), max(nums)
    if hi - lo < 1e-12:
        return SPARK[len(SPARK) // 2 - 1] * len(nums)
    top = len(SPARK) - 1
    return "".join(SPARK[round((v - lo) / (hi - lo) * top)] for v in nums)


def split_widths(pct: Mapping[str, float | None], width: int) -> dict[str, int]:
    """Characters per phase in a ``width``-wide bar: proportional, summing to ``width`` when
    the shares are known (largest remainder), all zero when none is."""
    shares = {p: max(_num(v) or 0.0, 0.0) for p, v in pct.items()}
    total = sum(shares.values())
    if total <= 0 or width <= 0:
        return dict.fromkeys(shares, 0)
    exact = {p: shares[p] / total * width for p in shares}
    out = {p: int(exact[p]) for p in shares}
    for p in sorted(shares, key=lambda p: exact[p] - out[p], reverse=True)[: width - sum(
            out.values())]:
        out[p] += 1
    return out


def _bar(pct: Mapping[str, float | None], width: int) -> Any:
    from rich.text import Text

    widths = split_widths(pct, width)
    if not any(widths.values()):
        return Text("·" * width, style="dim")
    bar = Text()
    for p, cells in widths.items():
        bar.append("█" * cells, style=_style(p))
    return bar


def _legend(pct: Mapping[str, float | None], *, short: bool = False) -> Any:
    """Each phase's colour and share; ``short``: abbreviated names, one space apart."""
    from rich.text import Text

    legend = Text()
    for p, v in pct.items():
        if legend:
            legend.append(" " if short else "  ")
        legend.append("█ ", style=_style(p))
        legend.append(f"{_abbrev(p) if short else p} {_pct(v)}")
    return legend


def _since_start(snapshot: Mapping[str, Any]) -> Any:
    from rich.text import Text

    first = _map(snapshot.get("first_window_pct"))
    now_pct = _pcts(snapshot)
    out = Text()
    for p, b in now_pct.items():
        a = _num(first.get(p))
        if a is None or b is None:
            continue
        # Rounded first, then the arrow: the numbers shown and the move always agree (3.4 -> 2.6
        # once read "3%→3% ▼1").
        before, after = round(a), round(b)
        delta = after - before
        arrow = "▲" if delta > 0 else "▼" if delta < 0 else "="
        move = f"{arrow}{abs(delta)}" if delta else "="
        if out:
            out.append("  ")
        out.append(f"{_abbrev(p)} {before}%→{after}% ")
        out.append(move, style="bold" if abs(delta) >= BIG_MOVE_PP else "dim")
    return out if out else Text("- (no first window yet)", style="dim")


def _step_time(snapshot: Mapping[str, Any], width: int) -> Any:
    """Median and p90 over the window, then the sparkline of the medians so far and their range,
    fitted into ``width`` columns."""
    from rich.text import Text

    window = _map(snapshot.get("window"))
    step_ms = _map(window.get("step_ms"))
    text = Text(f"median {_ms(_num(step_ms.get('median')))} ms · "
                f"p90 {_ms(_num(step_ms.get('p90')))} ms")
    history = snapshot.get("history_ms")
    hist = [v for v in (_num(x) for x in (history if isinstance(history, list) else []))
            if v is not None]
    room = width - len(text) - 3 - SPAN_ROOM
    shown = hist[-room:] if room >= 8 else []
    if shown:
        text.append("   ")
        text.append(sparkline(shown), style="cyan")
        text.append(f"  {_ms(min(shown))}–{_ms(max(shown))} ms", style="dim")
    return text


def _progress(snapshot: Mapping[str, Any], short: bool = False) -> Any:
    from rich.text import Text

    window = _map(snapshot.get("window"))
    steps = _int(snapshot.get("steps_done"))
    rate = _num(snapshot.get("steps_per_s"))
    win = _int(window.get("steps"))
    parts = [f"step {steps:,}" if steps is not None else "step -",
             f"{rate:,.1f} steps/s" if rate is not None else "- steps/s"]
    if short:
        return Text(" · ".join(parts))
    if win is not None:
        parts.append(f"window {win:,} steps")
    if window.get("clock") is not None:
        parts.append(f"clock {_str(window.get('clock'))}")
    return Text(" · ".join(parts))


def growth_flagged(snapshot: Mapping[str, Any]) -> bool:
    """Memory is growing: the memory diagnosis (built by the summary's own rules) says so."""
    return _kind(snapshot.get("memory_diagnosis")) == MemoryLabel.MEMORY_GROWTH.value


def _memory(snapshot: Mapping[str, Any]) -> Any:
    from rich.text import Text

    mem = _map(snapshot.get("memory"))
    alloc, reserved = _num(mem.get("allocated_mb")), _num(mem.get("reserved_mb"))
    rss = _num(mem.get("rss_mb"))
    # A GPU run's memory is the allocator's; the host's RSS is the CPU run's.
    on_device = alloc is not None or reserved is not None
    if on_device:
        parts = [f"allocated {_mb(alloc)}", f"reserved {_mb(reserved)}"]
    else:
        parts = [f"RSS {_mb(rss)}"]
    text = Text(" · ".join(parts))
    growth = _num(mem.get("growth_mb_per_1k_steps"))
    flagged = growth_flagged(snapshot)
    if growth is not None:
        # The basis is said only when it is not the memory the row shows first.
        basis = mem.get("growth_basis")
        implied = basis in (None, "allocated" if on_device else "rss")
        text.append(f" · growth{'' if implied else f' ({_str(basis, limit=20)})'} ")
        text.append(f"{growth:+,.1f} MB/1k steps", style="bold yellow" if flagged else "")
    if flagged:
        text.append(" ▲ GROWING", style="bold yellow")
    return text


def _diagnosis_cell(diag: Any, *, hint: bool = True) -> Any:
    from rich.console import Group
    from rich.text import Text

    d = _map(diag)
    kind = _kind(d)
    line = Text()
    line.append(_str(kind, "-", limit=40), style=_label_style(d) if kind else "dim")
    message = d.get("message")
    if message:
        line.append("  ")
        line.append(_str(message, limit=400))
    nxt = d.get("next_step")
    if hint and nxt:
        return Group(line, Text("→ " + _str(nxt, limit=600), style="dim"))
    return line


def _status_line(snapshots: Sequence[Mapping[str, Any]], lead: Mapping[str, Any],
                 now: float) -> Any:
    from rich.text import Text

    if run_ended(snapshots):
        status, path = ending(snapshots)
        text = Text()
        text.append(f"■ ended: {_str(status)}",
                    style="bold green" if status == "completed" else "bold red")
        text.append(" · summary: ")
        text.append(_str(path, "(not written)", limit=200), style="bold")
        return text
    stale = stale_ranks(snapshots, now)
    beat = _num(lead.get("heartbeat"))
    text = Text()
    if stale:
        who = "every rank" if len(stale) == len(snapshots) and len(snapshots) > 1 else \
            f"rank {', '.join(stale)}"
        text.append(f"⚠ stale: no heartbeat from {who}", style="bold red")
        if beat is not None and len(snapshots) == 1:
            text.append(f" for {_age(now - beat)}", style="bold red")
        text.append(" (hung, stopped, or gone)", style="red")
        return text
    ended_ranks = [s for s in snapshots if _status(s) in ENDED]
    if _status(lead) == RUNNING:
        text.append("● running", style="bold green")
    else:  # a writer this view does not know
        text.append(f"status {_str(lead.get('status'))}", style="yellow")
    if beat is not None:
        text.append(f" · heartbeat {_age(now - beat)} ago", style="dim")
    if ended_ranks:
        text.append(f" · {len(ended_ranks)} of {len(snapshots)} ranks ended", style="dim")
    return text


def _identity(lead: Mapping[str, Any], ranks: int) -> Any:
    from rich.text import Text

    text = Text()
    text.append(_str(lead.get("run_name"), "(unnamed run)"), style="bold")
    text.append(f" · {_str(lead.get('host'))} · pid {_str(lead.get('pid'))}")
    world = _int(lead.get("world_size"))
    if ranks > 1 or (world is not None and world > 1):
        text.append(f" · rank {_str(lead.get('rank'))} of {world if world else ranks}")
    return text


def _ranks_table(snapshots: Sequence[Mapping[str, Any]], now: float, room: int,
                 straggler: tuple[str, int] | None = None) -> Any:
    """A row per rank, in ``room`` columns; below 80, without the split bar and with
    shorter hosts and labels. ``straggler``: ``rank_straggler`` of all the ranks (the table
    may show only some), which labels the rows."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim",
                  expand=False)
    # On a narrow terminal the bar goes and the host and label give way: rank, steps and
    # heartbeat are what the table is for.
    wide = room >= 80
    bar_width = max(4, min(20, room - 74))
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("host", no_wrap=True, overflow="ellipsis", max_width=18 if wide else 8)
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("step ms", justify="right", no_wrap=True)
    if wide:
        table.add_column("split", no_wrap=True, overflow="crop")
    table.add_column("label", no_wrap=True, overflow="ellipsis", max_width=18 if wide else 12)
    table.add_column("beat", justify="right", no_wrap=True)
    for s in snapshots:
        stale = is_stale(s, now)
        steps = _int(s.get("steps_done"))
        median = _num(_map(_map(s.get("window")).get("step_ms")).get("median"))
        beat = _num(s.get("heartbeat"))
        status = _status(s)
        if stale:
            age = Text(f"STALE {_age(None if beat is None else now - beat)}", style="bold red")
        elif status in ENDED:
            age = Text(_str(status), style="dim")
        else:
            age = Text(_age(None if beat is None else now - beat), style="dim")
        cells = [
            Text(_str(s.get("rank"), "?"), style="bold red" if stale else ""),
            Text(_str(s.get("host"))),
            Text(f"{steps:,}" if steps is not None else "-"),
            Text(_ms(median)),
            *([_bar(_pcts(s), bar_width)] if wide else []),
            _rank_label(s, straggler, stale),
            age,
        ]
        table.add_row(*cells, style="red" if stale else None)
    return table


def render_frame(snapshots: Sequence[Mapping[str, Any]], *, now: float,
                 width: int = 100, height: int | None = None) -> Any:
    """The rich renderable of one frame of the view, ``width`` columns wide (``now``:
    wall-clock seconds, to age heartbeats). One rank: its split, how the split moved since the
    start, step time with a sparkline, progress, memory, GPU, diagnoses and status. Several:
    a row per rank first, then the lead (lowest) rank's detail.

    ``height``: the rows the frame may take (None: as many as it needs). A frame that would be
    taller becomes compact (one row each for split, step time, memory and labels; hints and
    the moves since the start left out; only the ranks that fit, stale ones first), and below
    that one plain line."""
    width = max(int(width), 40)
    if height is None:
        return _full_frame(snapshots, now, width)
    # The full frame's fewest rows: with many ranks it cannot fit, and is not even rendered.
    least = 3 if not snapshots else _FULL_ROWS + (len(snapshots) + 4 if len(snapshots) > 1
                                                  else 0)
    if least <= height:
        frame = _full_frame(snapshots, now, width)
        if _rows(frame, width) <= height:
            return frame
    frame = _compact_frame(snapshots, now, width, height)
    if frame is not None and _rows(frame, width) <= height:
        return frame
    from rich.text import Text

    line = Text(plain_progress_line(snapshots, now=now))
    line.truncate(width, overflow="ellipsis")
    return line


def _rows(renderable: Any, width: int) -> int:
    """The terminal rows ``renderable`` takes at ``width`` columns."""
    import io

    from rich.console import Console

    console = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    return len(console.render_lines(renderable, console.options, pad=False))


def _panel(parts: list[Any], snapshots: Sequence[Mapping[str, Any]], now: float,
           width: int) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    any_stale = any(is_stale(s, now) for s in snapshots)
    return Panel(Group(*parts), title=Text("traceml-ci live", style="bold"),
                 title_align="left", width=width,
                 border_style="red" if any_stale else "bright_black")


def _full_frame(snapshots: Sequence[Mapping[str, Any]], now: float, width: int) -> Any:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    if not snapshots:
        return Panel(Text("waiting for the first snapshot…", style="dim"),
                     title="traceml-ci live", title_align="left", width=width)
    lead = snapshots[0]
    label_w = 11
    inner = width - 4  # the panel's borders and padding
    value_w = inner - label_w - 1
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", width=label_w, no_wrap=True)
    grid.add_column(width=value_w)
    pct = _pcts(lead)
    grid.add_row("split", _bar(pct, value_w))
    grid.add_row("", _legend(pct))
    grid.add_row("since start", _since_start(lead))
    grid.add_row("step time", _step_time(lead, value_w))
    grid.add_row("progress", _progress(lead))
    grid.add_row("memory", _memory(lead))
    gpu = _num(lead.get("gpu_util_pct"))
    if gpu is not None:
        grid.add_row("GPU util", Text(f"{gpu:.0f}%"))
    grid.add_row("diagnosis", _diagnosis_cell(lead.get("diagnosis")))
    mem_diag = lead.get("memory_diagnosis")
    mem_kind = _kind(mem_diag)
    quiet = mem_kind in (None, MemoryLabel.BALANCED.value) or mem_kind in QUIET_KINDS
    grid.add_row("memory dx", _diagnosis_cell(mem_diag, hint=not quiet))

    parts: list[Any] = [_identity(lead, len(snapshots))]
    if len(snapshots) > 1:
        parts += [Text(""), _ranks_table(snapshots, now, inner, rank_straggler(snapshots, now)),
                  Text(""),
                  Text(f"rank {_str(lead.get('rank'), '?')} in detail", style="dim")]
    parts += [grid, Text(""), _status_line(snapshots, lead, now)]
    return _panel(parts, snapshots, now, width)


#: Rows of a full frame of one rank when nothing in it wraps and there is no hint: borders,
#: identity, split, legend, since start, step time, progress, memory, diagnosis, memory dx,
#: gap, status.
_FULL_ROWS = 13
#: Rows of a compact frame besides its ranks table: borders, identity, split, legend, step
#: time, memory, labels, status.
_COMPACT_ROWS = 9


def _compact_frame(snapshots: Sequence[Mapping[str, Any]], now: float, width: int,
                   height: int) -> Any:
    """The frame in about ``height`` rows, or None when even its fixed rows do not fit."""
    from rich.table import Table
    from rich.text import Text

    if not snapshots or height < _COMPACT_ROWS:
        return None
    lead = snapshots[0]
    inner = width - 4
    label_w = 6
    value_w = inner - label_w - 1
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", width=label_w, no_wrap=True)
    grid.add_column(width=value_w, no_wrap=True, overflow="ellipsis")
    pct = _pcts(lead)
    grid.add_row("split", _bar(pct, value_w))
    grid.add_row("", _legend(pct, short=True))
    grid.add_row("step", _step_time(lead, value_w))
    grid.add_row("memory", _memory(lead))
    labels = Text()
    for name, diag in (("", lead.get("diagnosis")), ("memory ", lead.get("memory_diagnosis"))):
        kind = _kind(diag)
        if labels:
            labels.append(" · ")
        labels.append(name)
        labels.append(_str(kind, limit=40), style=_label_style(diag) if kind else "dim")
    grid.add_row("dx", labels)
    parts: list[Any] = [_identity(lead, len(snapshots))]
    if len(snapshots) > 1:
        room = height - _COMPACT_ROWS - 1  # the table's header
        shown = _ranks_that_fit(snapshots, now, room)
        if shown:
            parts.append(_ranks_table(shown, now, inner, rank_straggler(snapshots, now)))
        hidden = len(snapshots) - len(shown)
        if hidden:
            parts.append(Text(f"… {hidden} more ranks", style="dim"))
    status = _progress(lead, short=True)
    status.append(" · ")
    status.append_text(_status_line(snapshots, lead, now))
    parts += [grid, status]
    return _panel(parts, snapshots, now, width)


def _ranks_that_fit(snapshots: Sequence[Mapping[str, Any]], now: float,
                    room: int) -> list[Mapping[str, Any]]:
    """At most ``room`` ranks (one row is kept for "… N more" when some are left out), the
    stale ones first, then the lowest; in rank order."""
    if len(snapshots) <= room:
        return list(snapshots)
    room -= 1
    if room <= 0:
        return []
    order = sorted(range(len(snapshots)), key=lambda i: (not is_stale(snapshots[i], now), i))
    return [snapshots[i] for i in sorted(order[:room])]
