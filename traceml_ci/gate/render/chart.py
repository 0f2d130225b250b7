"""Mermaid charts for the markdown report: where the step time goes, base against head.

Pure functions, a Comparison or SetComparison in, mermaid text out (GitHub renders a
```` ```mermaid ```` block in PR comments and job summaries). The chart is an ``xychart-beta``
horizontal bar chart with one stacked bar per side (base, head), per job for a set. Mermaid's
xychart has no stacked bars, but it draws bar series over each other in order, so each phase is
a series of *cumulative* shares, longest first: what shows of each bar is that phase's share.

Mermaid's syntax is code: every label taken from input goes through :func:`label`, which keeps a
small set of characters that cannot close a string, start a directive or end a line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from traceml_ci.gate.compare import Comparison, SetComparison, Verdict
from traceml_ci.summary.keys import WAIT_PHASE, phase_union

#: One colour per phase, and the emoji square of about that colour for the legend line
#: (xychart draws no legend of its own). A phase not listed here (one added later) is drawn
#: grey until it gets its own: charts take their phases from the summaries, not from here.
PHASE_COLOURS = {"dataloader": "#1f77b4", "forward": "#ff7f0e", "backward": "#2ca02c",
                 WAIT_PHASE: "#8c564b", "optimizer": "#d62728", "other": "#9467bd"}
PHASE_SQUARES = {"dataloader": "🟦", "forward": "🟧", "backward": "🟩", WAIT_PHASE: "🟫",
                 "optimizer": "🟥", "other": "🟪"}
_UNLISTED_COLOUR, _UNLISTED_SQUARE = "#7f7f7f", "⬜"


def phase_colour(phase: str) -> str:
    """``phase``'s colour in every chart (mermaid's and the HTML report's)."""
    return PHASE_COLOURS.get(phase, _UNLISTED_COLOUR)


#: At most this many jobs of a set are charted (two bars each); the rest are counted.
MAX_JOBS = 6
#: A category label is cut to this many characters.
MAX_LABEL = 32
#: No chart is longer than this (checked by the tests; 6 jobs with the longest labels fit).
MAX_CHART_CHARS = 2_000

#: Everything mermaid may read as syntax inside ``["..."]`` or ``title "..."``: quotes,
#: backticks, brackets, braces, semicolons, percent signs (``%%`` starts a comment or a
#: directive), hashes and ampersands (entities), angle brackets (HTML), line breaks and controls.
_UNSAFE = re.compile(r"[^A-Za-z0-9 _.,:/+=@()-]")
#: Brackets of every kind read as parentheses (which are safe), so ``test[large]`` stays readable.
_BRACKETS = str.maketrans("[]{}<>", "()()()")
_VERDICT_ORDER = {Verdict.REGRESSION: 0, Verdict.INCOMPARABLE: 1, Verdict.WARN: 2,
                  Verdict.PASS: 3}


def label(text: object, limit: int = MAX_LABEL) -> str:
    """``text`` made safe as a mermaid quoted label: brackets become parentheses, other
    characters outside a small safe set ``_``, runs of spaces one; cut in the middle to
    ``limit`` characters (marked ``..``), since names differ at either end (``test_x[3]``)."""
    text = str(text).translate(_BRACKETS)
    safe = re.sub(r" +", " ", _UNSAFE.sub("_", text)).strip() or "_"
    if len(safe) <= limit:
        return safe
    tail = (limit - 2) // 2
    return safe[: limit - 2 - tail] + ".." + safe[len(safe) - tail:]


def phase_split(c: Comparison, side: str) -> dict[str, float] | None:
    """The phase shares (percent) of one side (``"base"`` or ``"head"``), each of the phases
    its summary has, or None if any is missing."""
    shares = c.splits[0 if side == "base" else 1]
    if not shares or any(v is None for v in shares.values()):
        return None
    return {p: max(float(v), 0.0) for p, v in shares.items() if v is not None}


def bar_phases(bars: Sequence[tuple[str, Mapping[str, float]]]) -> tuple[str, ...]:
    """The phases drawn for ``bars``: every phase any of them has, in display order."""
    return phase_union(*(shares for _, shares in bars))


def stacked_chart(bars: list[tuple[str, Mapping[str, float]]], title: str) -> str:
    """An ``xychart-beta`` chart of one horizontal stacked bar per ``(label, shares)`` pair,
    shares in percent of the step, scaled to 100 when they add up to more (rounding); a
    phase a bar lacks is 0 there."""
    phases = bar_phases(bars)
    palette = ", ".join(phase_colour(p) for p in reversed(phases))
    names: list[str] = []
    for name, _ in bars:  # mermaid merges equal categories: keep each bar's label unique
        name = label(name)
        names.append(name if name not in names else label(f"{name} {len(names) + 1}"))
    height = 130 + 45 * len(bars)  # mermaid's default 500 px suits one or two bars badly
    lines = [
        '%%{init: {"xyChart": {"height": ' + str(height) + '}, "themeVariables": '
        '{"xyChart": {"plotColorPalette": "' + palette + '"}}}}%%',
        "xychart-beta horizontal",
        f'    title "{label(title, 80)}"',
        "    x-axis [" + ", ".join(f'"{name}"' for name in names) + "]",
        '    y-axis "% of step time" 0 --> 100',
    ]
    # The longest (cumulative to "other") first, so each later, shorter series covers it.
    cumulative = []
    for _, shares in bars:
        total = sum(shares.get(p, 0.0) for p in phases)
        scale = 100.0 / total if total > 100.0 else 1.0
        run, acc = [], 0.0
        for p in phases:
            acc += shares.get(p, 0.0) * scale
            run.append(acc)
        cumulative.append(run)
    for i in reversed(range(len(phases))):
        lines.append("    bar [" + ", ".join(f"{run[i]:.1f}" for run in cumulative) + "]")
    return "\n".join(lines) + "\n"


def legend(phases: Sequence[str]) -> str:
    """The legend line shown with a chart of ``phases`` (markdown-safe: fixed text)."""
    return "  ".join(f"{PHASE_SQUARES.get(p, _UNLISTED_SQUARE)} {label(p)}" for p in phases)


def comparison_phases(c: Comparison | SetComparison) -> tuple[str, ...]:
    """The phases :func:`comparison_chart` draws for ``c`` (its legend's)."""
    return bar_phases(_bars(c)[0])


def comparison_chart(c: Comparison | SetComparison) -> str | None:
    """The chart for a report: base and head of a comparison, or of up to :data:`MAX_JOBS`
    jobs of a set (flagged ones first); None when no side has a complete phase split."""
    bars, left = _bars(c)
    if not bars:
        return None
    if isinstance(c, Comparison):
        return stacked_chart(bars, "Share of step time, base vs head")
    title = "Share of step time per job, base vs head"
    if left:
        title += f" ({left} more not shown)"
    return stacked_chart(bars, title)


def _bars(c: Comparison | SetComparison) -> tuple[list[tuple[str, dict[str, float]]], int]:
    """The bars charted for ``c``, and how many jobs of a set were left out."""
    if isinstance(c, Comparison):
        return _sides(c, ""), 0
    ranked = sorted(c.items.items(), key=lambda kv: _VERDICT_ORDER[kv[1].verdict])
    bars, jobs, left = [], 0, 0
    for key, item in ranked:
        sides = _sides(item, _short_key(key))
        if not sides:
            continue
        if jobs == MAX_JOBS:
            left += 1
            continue
        bars += sides
        jobs += 1
    return bars, left


def _sides(c: Comparison, prefix: str) -> list[tuple[str, dict[str, float]]]:
    out = []
    for side in ("base", "head"):
        split = phase_split(c, side)
        if split is not None:
            name = f"{label(prefix, MAX_LABEL - 5)} {side}" if prefix else side
            out.append((name, split))
    return out


def _short_key(key: str) -> str:
    """A job key's most telling part: a pytest node id without its file path."""
    return key.rsplit("::", 1)[-1] if "::" in key else key


def markdown_block(chart: str, phases: Sequence[str]) -> list[str]:
    """Markdown lines: the legend of ``phases``, then the chart in a ``mermaid`` code block."""
    return [legend(phases), "", "```mermaid", *chart.rstrip("\n").split("\n"), "```", ""]
