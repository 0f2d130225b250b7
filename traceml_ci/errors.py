"""Typed, user-facing errors. Their messages are printed as-is; the CLI maps them to exit codes."""

from __future__ import annotations


class TracemlError(Exception):
    """Base of every error traceml-ci reports to a user. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class InputError(TracemlError):
    """A file given to us is unreadable, not JSON, schema-invalid or otherwise unusable (exit 2)."""

    exit_code = 2

    def __init__(self, path: str | None, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


class UsageError(TracemlError):
    """The command line itself is wrong (exit 2)."""

    exit_code = 2


class ApiError(TracemlError):
    """A call to a remote API (GitHub's) failed or was refused (exit 5)."""

    exit_code = 5


class MissingDependencyError(TracemlError):
    """Something this command needs is not installed, e.g. torch for tracing (exit 4)."""

    exit_code = 4
