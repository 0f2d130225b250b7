"""Typed, user-facing errors and the CLI's exit codes. Messages are printed as-is (one line);
``cli/main.py`` maps errors to exit codes, and every module that needs a code imports it here."""

from __future__ import annotations

import re
from enum import IntEnum


class ExitCode(IntEnum):
    """Every exit code ``traceml-ci`` returns, defined once. 1 means regression and nothing else.

    ``traceml-ci run`` is the one exception: it exits with the traced script's own code.
    """

    OK = 0  # pass, warn, valid, done
    REGRESSION = 1  # diff: a metric regressed beyond tolerance
    BAD_INPUT = 2  # a file or the command line is unusable
    INCOMPARABLE = 3  # diff: the two runs cannot be compared (e.g. no common phases)
    INTERNAL = 4  # a bug in traceml-ci: one line, "please report"
    API = 5  # a call to GitHub's API failed or was refused
    MISSING_DEPENDENCY = 6  # something the command needs is not installed (torch, to trace)
    # ab: no verdict within the rounds allowed (too noisy to tell): neither a pass nor a
    # regression -- re-run, or allow more rounds
    INCONCLUSIVE = 7
    INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT
    BROKEN_PIPE = 141  # stdout was closed early (``| head``): 128 + SIGPIPE, as a shell says


class TracemlError(Exception):
    """Base of every error traceml-ci reports to a user. ``exit_code`` is what the CLI returns;
    a subclass that does not say is bad input, never a regression."""

    exit_code: ExitCode = ExitCode.BAD_INPUT


class InputError(TracemlError):
    """A file given to us is unreadable, not JSON, schema-invalid or otherwise unusable (exit 2)."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, path: str | None, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


class UsageError(TracemlError):
    """The command line itself is wrong (exit 2)."""

    exit_code = ExitCode.BAD_INPUT


class ApiError(TracemlError):
    """A call to a remote API (GitHub's) failed or was refused (exit 5)."""

    exit_code = ExitCode.API


#: What a terminal or a CI log reads as more than text: C0 and C1 controls (newline, carriage
#: return, ESC), DEL, line and paragraph separators, bidirectional embeddings, overrides and
#: isolates (they reorder what is shown), and lone surrogates (undecodable file names).
UNSAFE_ON_A_LINE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def escape_line(text: object) -> str:
    """``text`` with each unsafe character shown as its visible escape (``\\n``, ``\\x1b``,
    ``\\u202e``, ``\\udcff``): no input can start a ``::workflow-command::`` line or move the
    cursor. The one escaper for terminals and CI logs (gate.fmt.plain, one_line)."""
    return UNSAFE_ON_A_LINE.sub(lambda m: ascii(m.group())[1:-1], str(text))


def one_line(text: object, limit: int = 500) -> str:
    """``text`` escaped for one line of a terminal or CI log, shortened to about ``limit``
    characters with a note."""
    s = str(text)
    if len(s) > limit:
        s = f"{s[:limit]}… ({len(s) - limit:,} more characters)"
    return escape_line(s)


class MissingDependencyError(TracemlError):
    """Something this command needs is not installed, e.g. torch for tracing (exit 6)."""

    exit_code = ExitCode.MISSING_DEPENDENCY


#: Where traceml-ci installs from until it is published on PyPI: a git URL for pip
#: (``<owner>``: the GitHub account that hosts your copy; the docs use the same placeholder).
SOURCE_URL = "git+https://github.com/<owner>/traceml-ci"


def install_hint(extra: str) -> str:
    """How to add one of traceml-ci's extras (``report``, ``hf``, ...): from a checkout, or from
    git -- PyPI has no traceml-ci yet, so a bare requirement finds nothing."""
    return (f"pip install -e '.[{extra}]' in a traceml-ci checkout, or "
            f"pip install 'traceml-ci[{extra}] @ {SOURCE_URL}'")  # fmt: skip
