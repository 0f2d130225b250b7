"""``traceml-ci`` entry point: parse, dispatch to a subcommand, map errors to exit codes.

Errors become exit codes here and nowhere else.

Each subcommand is a module in this package with ``register(subparsers)``, which adds its parser
and sets ``func`` (``args -> int``). Modules import their heavy dependencies inside ``func`` so
``traceml-ci --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from traceml_ci._version import __version__
from traceml_ci.errors import TracemlError

#: Subcommand modules, in --help order.
SUBCOMMANDS: tuple[str, ...] = (
    "run",
    "show",
    "validate",
    "diff",
    "combine",
    "history",
    "comment",
    "action_gate",
)

#: Command names (and aliases) that differ from their module's name.
COMMAND_MODULES: dict[str, str] = {"compare": "diff", "action-gate": "action_gate"}

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


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
    if argv == ["--version"]:  # without importing every subcommand to build the full parser
        print(f"traceml-ci {__version__}")
        return EXIT_OK
    parser = build_parser(_command_module(argv))
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except TracemlError as exc:
        print(f"traceml-ci: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _command_module(argv: Sequence[str]) -> str | None:
    """The subcommand module named by argv's first word, if it names one."""
    if not argv or argv[0].startswith("-"):
        return None
    name = COMMAND_MODULES.get(argv[0], argv[0])
    return name if name in SUBCOMMANDS else None


def entry() -> None:
    sys.exit(main())
