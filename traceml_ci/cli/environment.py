"""The front doors' one reader of the environment: every variable a command (``cli/*``) or the
pytest plugin reads is read here and handed on as a parameter. The tracer's own are read in
``tracer/config.py``, GitHub's in ``github/context.py``; a started process's environment is
built by ``childenv.child_env``. All of them: docs/architecture.md#environment-variables.

Light: stdlib and ``summary/keys.py`` only (``cli/main.py`` imports it at start-up)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from traceml_ci.summary.keys import ENV_OUT

#: An unexpected error prints its traceback as well as its one line.
ENV_DEBUG = "TRACEML_CI_DEBUG"
#: Seconds between ``traceml-ci run``'s plain progress lines (its ``--progress-interval``).
ENV_PROGRESS_INTERVAL = "TRACEML_CI_PROGRESS_INTERVAL"


def debug() -> bool:
    """Whether ``$TRACEML_CI_DEBUG`` asks for tracebacks (set and not empty)."""
    return bool(os.environ.get(ENV_DEBUG))


def out_dir() -> str | None:
    """``$TRACEML_CI_OUT``, the output folder a user set; None when unset or empty."""
    return os.environ.get(ENV_OUT) or None


def progress_interval_text(environ: Mapping[str, str] | None = None) -> str | None:
    """``$TRACEML_CI_PROGRESS_INTERVAL`` as written (``environ``: instead of ours, for tests);
    the caller parses it and names the variable when it is unreadable."""
    return (os.environ if environ is None else environ).get(ENV_PROGRESS_INTERVAL)


def dumb_terminal() -> bool:
    """``TERM=dumb``: a terminal that cannot move the cursor, so no live view on it."""
    return os.environ.get("TERM") == "dumb"


def colour(to_tty: bool) -> bool:
    """Whether text rendered for a terminal gets colour: only on a terminal, and never with
    ``NO_COLOR`` set (https://no-color.org). rich decides for its own consoles; this is for
    the reports we render ahead into a string (``traceml-ci diff``)."""
    return to_tty and "NO_COLOR" not in os.environ
