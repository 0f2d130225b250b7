"""The tracer's one way to warn: a line on stderr, never an exception into training."""

from __future__ import annotations

import sys


def warn(message: str) -> None:
    """``traceml-ci: warning: <message>`` on stderr.

    Not ``warnings.warn``: the user's filters (``pytest -W error``) could turn it into an
    exception, and the tracer must never raise into the training loop. A closed or broken
    stderr (at interpreter exit) loses the line, nothing more."""
    try:
        sys.stderr.write(f"traceml-ci: warning: {message}\n")
    except Exception:  # pragma: no cover
        pass
