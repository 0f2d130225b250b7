"""Plain-text formatting of values and deltas, shared by reasons and every renderer."""

from __future__ import annotations

from typing import Any


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


def value(x: Any, unit: str = "") -> str:
    """A row's base or head value: a label as is, a number with its unit, None as 'n/a'."""
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
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
