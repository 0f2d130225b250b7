"""Summary documents as the plugin handles them: read and checked against the schema."""

from __future__ import annotations

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
