"""``traceml-ci history FILES_OR_DIRS...``: each metric's trend over runs, and where it moved."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "history",
        help="trend of each metric over many summaries, and the run where it moved",
        description="Load summaries (files, or folders searched for *.json) ordered by "
        "run start time; print each metric's trend and the run at which it moved beyond its "
        "tolerance. Baseline sets contribute one series per key.",
    )
    p.add_argument("paths", nargs="+", metavar="FILE_OR_DIR")
    p.add_argument("--format", choices=("markdown", "csv"), default="markdown",
                   help="markdown: trend per metric; csv: one row per run (default: markdown)")
    p.add_argument("--tolerances", metavar="FILE", help="TOML rules file (see docs/gate.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from traceml_ci.gate.history import collect, render_history
    from traceml_ci.gate.rules import resolve_rules

    rules = resolve_rules(args.tolerances)
    runs = collect(args.paths)
    sys.stdout.write(render_history(runs, rules, output=args.format))
    return 0
