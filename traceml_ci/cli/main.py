"""``traceml-ci`` entry point: parse, dispatch to a subcommand, map errors to exit codes.

Errors become exit codes here and nowhere else (the codes: :class:`traceml_ci.errors.ExitCode`).
Whatever goes wrong, the user sees one line on stderr, never a traceback, and never exit 1,
which means "regression" only: a bug is exit 4 with the exception's type (set
``TRACEML_CI_DEBUG=1`` for the traceback).

Each subcommand is a module in this package with ``register(subparsers)``, which adds its parser
and sets ``func`` (``args -> int``). Modules import their heavy dependencies inside ``func`` so
``traceml-ci --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
from collections.abc import Sequence

from traceml_ci._version import __version__
from traceml_ci.cli import environment
from traceml_ci.cli.environment import ENV_DEBUG
from traceml_ci.errors import ExitCode, TracemlError, one_line

#: Subcommand modules, in --help order.
SUBCOMMANDS: tuple[str, ...] = (
    "run",
    "watch",
    "show",
    "validate",
    "diff",
    "ab",
    "combine",
    "history",
    "report",
    "record",
    "log",
    "comment",
    "action_gate",
)

#: Command names (and aliases) that differ from their module's name.
COMMAND_MODULES: dict[str, str] = {"compare": "diff", "action-gate": "action_gate"}

#: Commands that exit with a traced child's own code rather than one of ours.
PASSTHROUGH: frozenset[str] = frozenset({"run"})

_CODES: frozenset[int] = frozenset(ExitCode)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with ``only`` (a subcommand module), just that subcommand's, so a
    command does not pay for importing the others (diff's latency budget is 0.25 s)."""
    parser = argparse.ArgumentParser(
        prog="traceml-ci",
        description=(
            "Where each PyTorch training step's time and memory go -- and a CI gate on it. "
            "Run a script with tracing, inspect its final_summary.json, or compare two runs."
        ),
    )
    parser.add_argument("--version", action="version", version=f"traceml-ci {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in (only,) if only else SUBCOMMANDS:
        importlib.import_module(f"traceml_ci.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI in-process and return its exit code (tests call this directly)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return int(_guarded(argv))


def _guarded(argv: list[str]) -> int:
    """Every way a command can end, as one of the codes in the table."""
    try:
        return _dispatch(argv)
    except TracemlError as exc:
        if exc.exit_code not in _CODES or exc.exit_code in (ExitCode.OK, ExitCode.REGRESSION):
            return _internal(exc)  # an error class that claims success or a verdict is a bug
        _say(f"traceml-ci: error: {one_line(exc)}")
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return ExitCode.BROKEN_PIPE
    except SystemExit as exc:  # argparse's --help (0) and usage errors (2); others are bugs
        if exc.code in (None, ExitCode.OK, ExitCode.BAD_INPUT):
            raise
        return _internal(exc)
    except Exception as exc:  # noqa: BLE001 -- the contract: one line and exit 4, whatever it is
        return _internal(exc)


def _dispatch(argv: list[str]) -> int:
    if argv == ["--version"]:  # without importing every subcommand to build the full parser
        print(f"traceml-ci {__version__}")
        return ExitCode.OK
    parser = build_parser(_command_module(argv))
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return ExitCode.BAD_INPUT
    code = int(args.func(args))
    if args.command in PASSTHROUGH or code in _CODES:
        return code
    # Any other code would be read as something in the table (a stray 1 as a regression).
    return _internal(ValueError(f"command {args.command} returned undefined exit code {code}"))


def _internal(exc: BaseException) -> int:
    if environment.debug():
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    kind = type(exc).__name__
    detail = f"{kind}: {exc}" if str(exc) else kind
    _say(f"traceml-ci: internal error ({one_line(detail)}) - please report it "
         f"(set {ENV_DEBUG}=1 for the traceback)")
    return ExitCode.INTERNAL


def _say(line: str) -> None:
    """One line on stderr; if even that fails (stderr closed), stay silent."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush does not
    print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _command_module(argv: Sequence[str]) -> str | None:
    """The subcommand module named by argv's first word, if it names one."""
    if not argv or argv[0].startswith("-"):
        return None
    name = COMMAND_MODULES.get(argv[0], argv[0])
    return name if name in SUBCOMMANDS else None


def _guard_closed_stdout(argv: Sequence[str]) -> None:
    """A process started with stdout closed (``traceml-ci show x.json >&-``; Python leaves
    ``sys.stdout`` None) gets, on fd 1, the write end of a pipe nobody reads: what a command
    prints then fails as on a closed pipe, BrokenPipeError, exit 141 (not a crash on
    ``None.isatty()``, nor a silent 0), ``-o /dev/stdout`` included; a command that prints
    nothing to stdout (``diff -o FILE``) keeps its own code. And no file opened later can land on
    fd 1 and receive what was meant for stdout. ``run`` gets /dev/null there instead: the
    script's output was going nowhere, and a closed pipe would kill it on its first print."""
    if sys.stdout is not None:
        return
    try:
        os.fstat(1)
        return  # fd 1 is open after all (Python found it unusable): leave it
    except OSError:
        pass
    try:
        if _command_module(argv) in PASSTHROUGH:
            hold = os.open(os.devnull, os.O_WRONLY)
        else:
            read_end, hold = os.pipe()
            os.close(read_end)
        if hold != 1:
            os.dup2(hold, 1)
            os.close(hold)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", write_through=True)
    except OSError:
        pass


def entry() -> None:
    """The console script (and ``python -m traceml_ci``): ``sys.exit(main())``, with output
    that cannot crash on what it prints: a character the stream cannot encode (a lone surrogate
    from an undecodable file name) is written as its escape, ``\\udcff``, like ``one_line``;
    a closed stdout is a lost output, exit 141 (:func:`_guard_closed_stdout`)."""
    _guard_closed_stdout(sys.argv[1:])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError):  # replaced by something that cannot
            pass
    sys.exit(main())
