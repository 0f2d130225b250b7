"""Summary documents as the plugin handles them: read, checked against the schema, and the
median of several repeats picked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: At most this many schema problems are listed in a failure message.
MAX_PROBLEMS_SHOWN = 10


def read_summary(path: Path) -> dict[str, Any]:
    """The JSON document at ``path`` (not yet validated); an unreadable one fails the test with
    the reader's one-line message, not a traceback."""
    __tracebackhide__ = True
    import pytest

    from traceml_ci.errors import InputError
    from traceml_ci.summary.io import read_json

    try:
        return read_json(path)
    except InputError as exc:
        message = f"traceml: {exc}"
    pytest.fail(message, pytrace=False)


def summary_problems(doc: Any) -> list[str]:
    """Every schema / semantic problem of a summary document, as ``$.json.path: reason``."""
    from traceml_ci.summary.schema import summary_problems as problems

    return [str(p) for p in problems(doc)]


def _step_median(doc: dict[str, Any]) -> float:
    try:
        value = doc["step_time"]["step_ms"]["median"]
    except (KeyError, TypeError):
        return float("inf")
    return float(value) if isinstance(value, (int, float)) else float("inf")


def median_summary(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The repeat whose median step time is the median of the repeats (the lower middle one
    for an even count). A real, self-consistent summary -- not a blend of several runs -- so it
    validates and can be stored as a baseline as it is."""
    if not docs:
        raise ValueError("no summaries to take the median of")
    order = sorted(range(len(docs)), key=lambda i: (_step_median(docs[i]), i))
    return docs[order[(len(docs) - 1) // 2]]
