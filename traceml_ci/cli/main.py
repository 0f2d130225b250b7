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
    "history",
    "comment",
    "action_gate",
)

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="traceml-ci",
        description=(
            "Where each PyTorch training step's time and memory go -- and a CI gate on it. "
            "Run a script with tracing, inspect its final_summary.json, or compare two runs."
        ),
    )
    parser.add_argument("--version", action="version", version=f"traceml-ci {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"traceml_ci.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI in-process and return its exit code (tests call this directly)."""
    parser = build_parser()
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


def entry() -> None:
    sys.exit(main())
