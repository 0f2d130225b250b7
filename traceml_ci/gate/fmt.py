"""Formatting of values and deltas, and the one escaping helper per output medium.

Anything that comes from a summary (run names, keys, labels, environment strings, notes built
from them) goes through the helper of the medium it is written to, and only that one:

- :func:`plain` for terminal text and CI logs (``diff --format text``, ``show``, CSV);
- :func:`markdown` for GitHub markdown (PR comments, ``--format markdown``, history);
- :func:`json_safe` for JSON reports.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from traceml_ci.errors import escape_line


def plain(text: Any) -> str:
    """Text safe to print to a terminal or a CI log: one line, nothing a terminal or a runner
    acts on. Newlines and other controls, bidirectional overrides and lone surrogates become
    visible backslash escapes (``\\n``, ``\\x1b``, ``\\u202e``, ``\\udcff``), so no input can
    start a ``::workflow-command::`` line or move the cursor."""
    return escape_line(text)


#: A zero-width space, as an entity: GitHub links mentions, issue references and bare URLs in
#: the rendered text, after entities are decoded, so only a character in between stops them.
_ZWSP = "&#8203;"
_MD_ESCAPES = {
    "&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "&#124;", "`": "&#96;", "@": "@" + _ZWSP,
    "#": "#" + _ZWSP, "[": "&#91;", "]": "&#93;", "\\": "&#92;", "*": "&#42;",
}
#: Bare-URL starts GitHub autolinks: ``https://x``, ``www.x``.
_AUTOLINKS = (("://", ":" + _ZWSP + "//"), ("www.", "www" + _ZWSP + "."))
#: ``GH-7``: GitHub's other issue-reference form (case-insensitive).
_GH_REF = re.compile(r"(?i)\b(gh)-(?=\d)")
_MD_SPACE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: Shown as a visible escape rather than applied: bidirectional controls and lone surrogates.
_MD_VISIBLE = re.compile("[\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def markdown(text: Any) -> str:
    """Make input text inert in GitHub markdown: no table breaks, HTML, code spans, links,
    autolinks, mentions, ``#n`` or ``GH-n`` references or ``*`` emphasis; newlines and other
    control characters become spaces; bidirectional overrides and lone surrogates a visible
    escape (``\\u202e``). (``_`` is left alone: GitHub never reads it as emphasis inside a word like
    ``step_ms``.)"""
    s = _MD_SPACE.sub(" ", str(text))
    s = "".join(_MD_ESCAPES.get(ch, ch) for ch in s)
    # after the escapes: this backslash is text (markdown escapes only ASCII punctuation)
    s = _MD_VISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", s)
    for start, broken in _AUTOLINKS:
        s = s.replace(start, broken)
    return _GH_REF.sub(lambda m: m.group(1) + _ZWSP + "-", s)


def json_safe(obj: Any) -> Any:
    """``obj`` with every string (keys too) free of lone surrogates, which no UTF-8 output can
    encode: each becomes the visible text ``\\udcff``. JSON escapes control characters itself."""
    if isinstance(obj, str):
        return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", obj)
    if isinstance(obj, Mapping):
        return {json_safe(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def number(x: float) -> str:
    """A number with about three significant digits, thousands separated when large."""
    if x != x:  # NaN never reaches here from validated input; be safe anyway
        return "nan"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1 or ax == 0:
        return f"{x:.2f}"
    return f"{x:.3g}"


#: SI prefixes for FLOP counts and rates, smallest first.
SI_PREFIXES = (("", 1.0), ("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12), ("P", 1e15),
               ("E", 1e18))
#: Units a FLOP figure is stored in (gate/metrics.py, the summary's ``efficiency``) -> FLOP.
FLOP_UNITS = {"FLOP": 1.0, "FLOP/s": 1.0, "TFLOP/s": 1e12}


def flops(x: float, per_s: bool = False) -> str:
    """A FLOP count (or, ``per_s``, a rate in FLOP/s) with the SI prefix that fits and three
    significant figures: ``647 kFLOP``, ``1.25 GFLOP``, ``116 GFLOP/s``. The one formatter of
    FLOPs: ``traceml-ci show``, the gate's rows and its context lines all use it."""
    unit = "FLOP/s" if per_s else "FLOP"
    if x != x:
        return f"nan {unit}"
    ax = abs(x)
    prefix, scale = SI_PREFIXES[0]
    for p, s in SI_PREFIXES:
        if ax >= s:
            prefix, scale = p, s
    text = f"{x / scale:.3g}"
    # 999.7 kFLOP rounds to 1000 kFLOP at three figures: 1 MFLOP.
    if abs(float(text)) >= 1000 and prefix != SI_PREFIXES[-1][0]:
        i = [p for p, _ in SI_PREFIXES].index(prefix) + 1
        prefix, scale = SI_PREFIXES[i]
        text = f"{x / scale:.3g}"
    if "e" in text:  # beyond the largest prefix, or a rate below 0.001 FLOP/s
        text = f"{x / scale:,.0f}" if ax >= 1 else f"{x:.3g}"
    return f"{text} {prefix}{unit}"


def value(x: Any, unit: str = "") -> str:
    """A row's base or head value: a label as is, a number with its unit, None as 'n/a'.
    FLOP counts and rates get the SI prefix that fits (``flops``)."""
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    if unit in FLOP_UNITS:
        return flops(float(x) * FLOP_UNITS[unit], per_s=unit.endswith("/s"))
    if isinstance(x, int) and not isinstance(x, bool) and not unit:
        return f"{x:,}"  # a count or a setting: exact
    text = number(float(x))
    if not unit:
        return text
    return f"{text}%" if unit == "%" else f"{text} {unit}"


def delta(d: float | None, unit: str) -> str:
    """A signed change: '+3.2 pp', '-12%', '' for labels, 'n/a' when undefined."""
    if not unit:
        return ""
    if d is None:
        return "n/a"
    if d == 0:
        return f"0 {unit}" if unit != "%" else "0%"
    sign = "+" if d > 0 else "−"
    ad = abs(d)
    text = f"{ad:,.0f}" if ad >= 100 else f"{ad:.1f}" if ad >= 1 else f"{ad:.2f}"
    return f"{sign}{text}%" if unit == "%" else f"{sign}{text} {unit}"


def github_table(rows: list[list[str]], headers: list[str]) -> str:
    """A GitHub markdown table. Padded by code points, whether or not ``wcwidth`` is installed
    (tabulate pads emoji as two columns when it is): the same report on every machine, and
    markdown ignores the padding anyway."""
    import tabulate as tabulate_module

    wide, tabulate_module.WIDE_CHARS_MODE = tabulate_module.WIDE_CHARS_MODE, False
    try:
        return tabulate_module.tabulate(rows, headers=headers, tablefmt="github",
                                        disable_numparse=True)
    finally:
        tabulate_module.WIDE_CHARS_MODE = wide
