"""Numeric options, checked once for every command: each is an argparse ``type`` that raises
UsageError, so a bad value is one line naming the option (``traceml-ci: error: --width 0: must
be a whole number of at least 40``) and exit 2, never NaN, inf, a traceback or empty output."""

from __future__ import annotations

import math
from collections.abc import Callable

from traceml_ci.errors import UsageError

#: Narrowest text a table can be drawn in (show, diff): narrower, rich draws nothing useful.
MIN_WIDTH = 40


def _number(text: str) -> float:
    """``text`` as a float; NaN, which every check here refuses, when it is not a number."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def seconds(flag: str, *, zero: str | None = None) -> Callable[[str], float]:
    """A finite number of seconds above 0; ``zero``: what 0 means, when it is allowed."""
    rule = f">= 0 (0: {zero})" if zero else "> 0"

    def parse(text: str) -> float:
        value = _number(text)
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise UsageError(f"{flag} {text!r}: must be a finite number of seconds {rule}")
        return value

    return parse


def amount(flag: str) -> Callable[[str], float]:
    """A finite number of at least 0 (a tolerance in % or percentage points)."""

    def parse(text: str) -> float:
        value = _number(text)
        if not math.isfinite(value) or value < 0:
            raise UsageError(f"{flag} {text!r}: must be a number >= 0")
        return value

    return parse


def whole(flag: str, *, least: int = 0) -> Callable[[str], int]:
    """A whole number of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise UsageError(f"{flag} {text!r}: must be a whole number of at least {least}")
        return value

    return parse


def width(flag: str = "--width") -> Callable[[str], int]:
    """Text width in columns, at least MIN_WIDTH."""
    return whole(flag, least=MIN_WIDTH)
