"""Renderers: a Comparison or SetComparison in, a string out (markdown, terminal text, JSON).

Pure functions; width and colour are parameters. tabulate and rich are imported inside the
renderer that needs them. Everything taken from input (run names, keys, labels, notes) goes
through its medium's escaping helper in gate/fmt.py: ``fmt.markdown`` for markdown,
``fmt.plain`` for terminal text, ``fmt.json_safe`` for JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from traceml_ci.gate import causes, fmt
from traceml_ci.gate.compare import Comparison, Row, SetComparison, Status, Verdict
from traceml_ci.gate.render.lead import lead_lines
from traceml_ci.gate.render.ranks import (
    headline_line,
    rank_headers,
    rank_rows,
    straggler_line,
    straggler_next_step,
)
from traceml_ci.summary.keys import ALL_PHASES, H2D_PHASE, WAIT_PHASE, phases_in

#: First line of every markdown report, so a bot can find its PR comment and update it.
MARKER = "<!-- traceml-ci:report -->"
#: GitHub refuses comments over 65,536 characters; stay under it with room for a footer.
MAX_MARKDOWN_CHARS = 60_000
BAR_WIDTH = 40
#: One fill character per phase, in ALL_PHASES order, for the stacked bars.
BAR_CHARS = {"dataloader": "█", H2D_PHASE: "=", "forward": "▓", "backward": "▒",
             WAIT_PHASE: "~",
             "optimizer": "░", "other": "·"}

VERDICT_ICON = {
    Verdict.PASS: "✅", Verdict.WARN: "⚠️", Verdict.REGRESSION: "❌", Verdict.INCOMPARABLE: "⚪",
}
STATUS_ICON = {
    Status.OK: "", Status.IMPROVED: "🟢", Status.WARN: "🟡", Status.REGRESSED: "🔴",
    Status.NEW: "🆕", Status.MISSING: "⚪",
}
STATUS_STYLE = {
    Status.OK: "dim", Status.IMPROVED: "green", Status.WARN: "yellow",
    Status.REGRESSED: "bold red", Status.NEW: "cyan", Status.MISSING: "magenta",
}
VERDICT_STYLE = {
    Verdict.PASS: "bold green", Verdict.WARN: "bold yellow", Verdict.REGRESSION: "bold red",
    Verdict.INCOMPARABLE: "bold magenta",
}

# --- shared pieces -------------------------------------------------------------------------


def _headline(c: Comparison | SetComparison) -> str:
    """The one-line verdict, plain text (escaped by the caller where needed)."""
    if isinstance(c, SetComparison):
        n = len(c.items)
        bad = sum(1 for x in c.items.values() if x.verdict is Verdict.REGRESSION)
        warn = sum(1 for x in c.items.values() if x.verdict is Verdict.WARN)
        parts = [f"{n} compared"]
        if bad:
            parts.append(f"{bad} regressed")
        if warn:
            parts.append(f"{warn} warned")
        if c.added:
            parts.append(f"{len(c.added)} added")
        if c.removed:
            parts.append(f"{len(c.removed)} removed")
        return f"{c.verdict.value}: " + ", ".join(parts)
    counts = {s: sum(1 for r in c.rows if r.status is s) for s in Status}
    if c.verdict is Verdict.INCOMPARABLE:
        return "incomparable: nothing left to compare"
    if c.verdict is Verdict.REGRESSION:
        tail = f"{counts[Status.REGRESSED]} metric(s) beyond tolerance and noise"
    elif c.verdict is Verdict.WARN:
        tail = f"{counts[Status.WARN] + counts[Status.MISSING]} metric(s) to look at"
    else:
        tail = "no metric beyond tolerance"
    if counts[Status.IMPROVED]:
        tail += f", {counts[Status.IMPROVED]} improved"
    return f"{c.verdict.value}: {tail}"


def shown_causes(c: Comparison | SetComparison) -> tuple[str, ...]:
    """The causes a comparison's headline names: none when it is incomparable (and a set's
    own headline names none: each key's section names its own)."""
    if isinstance(c, SetComparison) or c.verdict is Verdict.INCOMPARABLE:
        return ()
    return tuple(c.causes)


def markdown_causes(items: Sequence[str], *, passed: bool) -> list[str]:
    """Markdown lines naming ``items`` (gate/causes.py) under a headline, before any table: one
    line, or a list; in bold unless the verdict ``passed``. Escaped here."""
    label = causes.label(len(items), passed=passed).capitalize()
    if not label:
        return []
    title = f"{label}:" if passed else f"**{label}:**"
    if len(items) == 1:
        return [f"{title} {fmt.markdown(items[0])}", ""]
    return [title, "", *(f"- {fmt.markdown(x)}" for x in items), ""]


def text_causes(items: Sequence[str], *, passed: bool) -> list[str]:
    """Terminal lines naming ``items``, one each (``cause: …``), escaped for a terminal."""
    label = causes.label(len(items), passed=passed).removesuffix("s")
    return [f"{label}: {fmt.plain(x)}" for x in items]


def _delta(row: Row) -> str:
    if isinstance(row.base, str) or isinstance(row.head, str):
        return "changed" if row.base != row.head and None not in (row.base, row.head) else ""
    return fmt.delta(row.delta, row.delta_unit)


def _split(c: Comparison, side: str) -> dict[str, float] | None:
    values = {}
    for phase in ALL_PHASES:
        row = c.row(f"step_time.{phase}_pct")
        v = getattr(row, side) if row else None
        # a run without a process group / without copies to a device
        if phase in (WAIT_PHASE, H2D_PHASE) and v is None:
            continue
        if not isinstance(v, float):
            return None
        values[phase] = max(v, 0.0)
    return values


def split_bar(pcts: dict[str, float], width: int = BAR_WIDTH) -> str:
    """A stacked bar of exactly ``width`` characters, one fill character per phase; widths by
    largest remainder so they always add up."""
    total = sum(pcts.values()) or 1.0
    exact = {k: v / total * width for k, v in pcts.items()}
    cells = {k: int(x) for k, x in exact.items()}
    order = sorted(exact, key=lambda k: exact[k] - cells[k], reverse=True)
    for k in order[: width - sum(cells.values())]:
        cells[k] += 1
    return "".join(BAR_CHARS[k] * cells[k] for k in ALL_PHASES if k in cells)


def _bars(c: Comparison, width: int) -> list[str] | None:
    base, head = _split(c, "base"), _split(c, "head")
    if base is None and head is None:
        return None
    lines = []
    for side, split in (("base", base), ("head", head)):
        if split is not None:
            lines.append(f"{side}  {split_bar(split, width)}")
    shown = phases_in({p for s in (base, head) if s is not None for p in s})
    lines.append("      " + "  ".join(f"{BAR_CHARS[p]} {p}" for p in shown))
    return lines


def _md_ranks(c: Comparison) -> list[str]:
    """The folded per-rank section: each side's straggler line and per-rank table."""
    pairs = zip(("base", "head"), c.distributed, strict=True)
    sides = [(side, b) for side, b in pairs if b is not None]
    if not sides:
        return []
    n = max(int(b.get("world_size") or 0) for _, b in sides)
    out = [f"<details><summary>Ranks ({n})</summary>", ""]
    for side, block in sides:
        out += [f"**{side}**: {fmt.markdown(straggler_line(block))}", ""]
        step = straggler_next_step(block)
        if step and (block.get("straggler") or {}).get("rank") is not None:
            out += [f"→ {fmt.markdown(step)}", ""]
        rows = [[fmt.markdown(x) for x in row] for row in rank_rows(block)]
        if rows:
            out += [fmt.github_table(rows, rank_headers(block)), ""]
        if headline_line(block):
            out += [fmt.markdown(headline_line(block)), ""]
        if block.get("ranks_not_listed"):
            out += [f"*…and {int(block['ranks_not_listed'])} more ranks (quantiles in the "
                    "summary)*", ""]
    return out + ["</details>", ""]


# --- markdown ------------------------------------------------------------------------------


def _md_rows(rows: list[Row]) -> str:
    table = [
        [
            fmt.markdown(r.name),
            fmt.markdown(fmt.value(r.base, r.unit)),
            fmt.markdown(fmt.value(r.head, r.unit)),
            fmt.markdown(_delta(r)),
            fmt.markdown(str(r.tolerance)) if r.tolerance else "—",
            (f"{STATUS_ICON[r.status]} {r.status.value}".strip()
             + (f" — {fmt.markdown(r.note)}" if r.note else "")),
        ]
        for r in rows
    ]
    return fmt.github_table(table, ["metric", "base", "head", "Δ", "tolerance", "status"])


def _md_comparison(c: Comparison, width: int, *, heading: str | None = None) -> list[str]:
    out: list[str] = []
    if heading:
        out += [heading, ""]
    out += markdown_causes(shown_causes(c), passed=c.verdict is Verdict.PASS)
    out += [fmt.markdown(x) for x in lead_lines(c)] + ([""] if lead_lines(c) else [])
    if c.base_run or c.head_run:
        base, head = fmt.markdown(c.base_run or "?"), fmt.markdown(c.head_run or "?")
        out += [f"base *{base}* → head *{head}*", ""]
    if c.notes:  # the rows themselves say what regressed
        out += [f"- {fmt.markdown(r)}" for r in c.notes] + [""]
    shown = [r for r in c.rows if r.changed]
    folded = [r for r in c.rows if not r.changed]
    if shown:
        out += [_md_rows(shown), ""]
    bars = _bars(c, width)
    if bars:
        out += ["Where the step time goes:", "", "```text", *bars, "```", ""]
    if folded:
        informing = any(r.note for r in folded)
        label = (f"{len(folded)} unchanged {'or informing ' if informing else ''}"
                 f"metric{'s' if len(folded) != 1 else ''}")
        out += [f"<details><summary>{label}</summary>", "", _md_rows(folded), "", "</details>",
                ""]
    out += _md_ranks(c)
    return out


def render_markdown(c: Comparison | SetComparison, *, width: int = BAR_WIDTH,
                    max_chars: int = MAX_MARKDOWN_CHARS) -> str:
    """GitHub-flavoured markdown for a PR comment. First line: ``<!-- traceml-ci:report -->``;
    then the one-line verdict, the changed rows, the phase split as before/after bars, and the
    unchanged rows folded under ``<details>``. ``width``: bar width in characters."""
    head = f"**{VERDICT_ICON[c.verdict]} traceml-ci {fmt.markdown(_headline(c))}**"
    out = [MARKER, head, ""]
    if isinstance(c, Comparison):
        out += _md_comparison(c, width)
    else:
        out += _md_set(c, width, max_chars)
    out += _md_chart(c, max_chars - sum(len(x) + 1 for x in out))
    out.append(f"<sub>rules: {fmt.markdown(c.rules_source)}</sub>")
    return "\n".join(out).rstrip("\n") + "\n"


# --- markdown: the mermaid chart (gate/render/chart.py) -------------------------------------------


def _md_chart(c: Comparison | SetComparison, budget: int) -> list[str]:
    """The phase-split chart under the tables, if there is a split to draw and room for it."""
    from traceml_ci.gate.render import chart

    drawn = chart.comparison_chart(c)
    if drawn is None:
        return []
    block = chart.markdown_block(drawn, chart.comparison_phases(c))
    return block if sum(len(x) + 1 for x in block) < budget - 200 else []


# --- markdown: sets ------------------------------------------------------------------------


_VERDICT_ORDER = {Verdict.REGRESSION: 0, Verdict.INCOMPARABLE: 1, Verdict.WARN: 2,
                  Verdict.PASS: 3}


#: Causes named in a key's row of the sets' table (the rest: "+N more", all in its section).
CAUSES_IN_ROW = 2


def _md_key_table(
    items: list[tuple[str, Comparison]], budget: int, *, with_causes: bool = False
) -> tuple[str, int]:
    """The per-key summary table, cut to ``budget`` characters; returns it and the rows cut.
    ``with_causes``: a column of each key's causes before what changed (the flagged keys')."""
    rows, used = [], 0
    for key, item in items:
        changed = [r for r in item.rows if r.status in (Status.REGRESSED, Status.WARN,
                                                        Status.MISSING, Status.IMPROVED)]
        what = ", ".join(
            f"{fmt.markdown(r.name)} {fmt.markdown(_delta(r))}".strip() for r in changed[:3]
        ) + (f" (+{len(changed) - 3} more)" if len(changed) > 3 else "")
        row = [fmt.markdown(key), f"{VERDICT_ICON[item.verdict]} {item.verdict.value}"]
        if with_causes:
            named = "; ".join(fmt.markdown(x) for x in item.causes[:CAUSES_IN_ROW])
            more = len(item.causes) - CAUSES_IN_ROW
            row.append((named + (f" (+{more} more)" if more > 0 else "")) or "—")
        row.append(what or "—")
        used += sum(len(x) + 3 for x in row) + 2
        if used > budget and rows:
            break
        rows.append(row)
    headers = ["key", "verdict", *(["cause"] if with_causes else []), "changed"]
    return fmt.github_table(rows, headers), len(items) - len(rows)


def _md_set(c: SetComparison, width: int, max_chars: int) -> list[str]:
    out: list[str] = [fmt.markdown(x) for x in lead_lines(c)]
    out += [""] if out else []
    if c.reasons:
        out += [f"- {fmt.markdown(r)}" for r in c.reasons] + [""]
    ranked = sorted(c.items.items(), key=lambda kv: _VERDICT_ORDER[kv[1].verdict])
    flagged = [(k, v) for k, v in ranked if v.verdict is not Verdict.PASS]
    passed = [(k, v) for k, v in ranked if v.verdict is Verdict.PASS]
    budget = max_chars // 2
    if flagged:
        table, cut = _md_key_table(
            flagged, budget, with_causes=any(item.causes for _, item in flagged)
        )
        out += [table, ""]
        if cut:
            out += [f"*…and {cut} more not shown (use --format json)*", ""]
    if passed:
        table, cut = _md_key_table(passed, budget // 2)
        out += [f"<details><summary>{len(passed)} passed</summary>", "", table, ""]
        if cut:
            out += [f"*…and {cut} more not shown*", ""]
        out += ["</details>", ""]
    used = sum(len(x) + 1 for x in out)
    for key, item in flagged:
        section = _md_comparison(
            item, width, heading=f"#### {VERDICT_ICON[item.verdict]} {fmt.markdown(key)}"
        )
        size = sum(len(x) + 1 for x in section)
        if used + size > max_chars:
            out += ["*(further details left out to fit a comment; use --format json)*", ""]
            break
        out += section
        used += size
    return out


# --- text (rich) ---------------------------------------------------------------------------


def _rich_table(rows: list[Row]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(show_edge=False, pad_edge=False, expand=False)
    table.add_column("metric", no_wrap=True, min_width=max((len(r.name) for r in rows), default=6))
    for name, justify in (("base", "right"), ("head", "right"), ("Δ", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("tolerance")
    table.add_column("status")
    for r in rows:
        status = Text(r.status.value, style=STATUS_STYLE[r.status])
        if r.note:
            status.append(f" — {fmt.plain(r.note)}", style="dim")
        table.add_row(
            Text(r.name), Text(fmt.plain(fmt.value(r.base, r.unit))),
            Text(fmt.plain(fmt.value(r.head, r.unit))),
            Text(_delta(r)), Text(str(r.tolerance) if r.tolerance else "—"), status,
            style="dim" if r.status is Status.OK else None,
        )
    return table


class _Reason(str):
    """A reason line: printed as rich Text, wrapped at the width or not (render_text)."""

    style = ""


class _Cause(_Reason):
    """A cause under a headline: a reason line, in bold."""

    style = "bold"


def _rich_comparison(c: Comparison, width: int, title: str | None = None) -> list[Any]:
    from rich.text import Text

    parts: list[Any] = []
    if title:
        parts.append(Text(title, style=VERDICT_STYLE[c.verdict]))
    for line in text_causes(shown_causes(c), passed=c.verdict is Verdict.PASS):
        parts.append(_Cause(line))
    for line in lead_lines(c):
        parts.append(_Reason(fmt.plain(line)))
    if c.base_run or c.head_run:
        base, head = fmt.plain(c.base_run or "?"), fmt.plain(c.head_run or "?")
        parts.append(Text(f"base {base} → head {head}", style="dim"))
    for reason in c.reasons:
        parts.append(_Reason(f"• {fmt.plain(reason)}"))
    table_rows = [r for r in c.rows if r.gating or r.note or r.status is not Status.OK]
    if table_rows:
        parts.append(_rich_table(table_rows))
    info = [r for r in c.rows if r not in table_rows]
    if info:  # informational rows on one line: a table of them costs more than it tells
        parts.append(Text("also: " + ", ".join(
            f"{r.name.removeprefix('step_time.')} "
            f"{_delta(r) or fmt.plain(fmt.value(r.head, r.unit))}"
            for r in info), style="dim"))
    bars = _bars(c, max(10, min(BAR_WIDTH, width - 8)))
    if bars:
        parts.append(Text("\n".join(bars), style="cyan"))
    for side, block in zip(("base", "head"), c.distributed, strict=True):
        if block is not None:
            parts.append(Text(f"{side} ranks: {fmt.plain(straggler_line(block))}"))
    return parts


def render_text(c: Comparison | SetComparison, *, width: int = 100, colour: bool = False,
                wrap_reasons: bool = True) -> str:
    """Terminal text through rich: ``width`` in columns; ``colour`` adds ANSI styles.
    ``wrap_reasons=False``: each reason line whole on one line, however long (a failure message
    that a reader searches, or a terminal wraps itself); the table still fits ``width``."""
    from io import StringIO

    from rich.console import Console
    from rich.text import Text

    buf = StringIO()
    console = Console(file=buf, width=width, color_system="standard" if colour else None,
                      force_terminal=colour, no_color=not colour, highlight=False,
                      emoji=False, soft_wrap=False)
    console.print(Text(f"traceml-ci {_headline(c)}", style=VERDICT_STYLE[c.verdict]))

    def put(part: Any) -> None:
        if isinstance(part, _Reason):
            console.print(Text(part, style=part.style), soft_wrap=not wrap_reasons)
        else:
            console.print(part)

    if isinstance(c, Comparison):
        for part in _rich_comparison(c, width):
            put(part)
    else:
        for line in lead_lines(c):
            put(_Reason(fmt.plain(line)))
        for reason in c.reasons:
            put(_Reason(f"• {fmt.plain(reason)}"))
        for key, item in c.items.items():
            console.print()
            title = f"{fmt.plain(key)}: {item.verdict.value}"
            for part in _rich_comparison(item, width, title=title):
                put(part)
    console.print(Text(f"rules: {fmt.plain(c.rules_source)}", style="dim"))
    return buf.getvalue()


# --- json ----------------------------------------------------------------------------------


def render_json(c: Comparison | SetComparison, *, indent: int | None = 2) -> str:
    """The comparison as JSON, for machines (``schema_version`` versions the report shape)."""
    return json.dumps(fmt.json_safe(c.to_dict()), indent=indent, ensure_ascii=False,
                      allow_nan=False) + "\n"
