"""``traceml-ci history FILES_OR_DIRS... | --db FILE``: each metric's trend over runs, and where
it moved."""

from __future__ import annotations

import argparse
import sys

from traceml_ci.cli.options import whole
from traceml_ci.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "history",
        help="trend of each metric over many summaries, and the run where it moved",
        description="Load summaries (files, or folders searched for *.json, and/or the runs "
        "recorded in a history database with `traceml-ci record`) ordered by run start time; "
        "print each metric's trend and the run at which it moved beyond its tolerance. "
        "Baseline sets contribute one series per key.",
    )
    p.add_argument("paths", nargs="*", metavar="FILE_OR_DIR")
    p.add_argument("--db", metavar="FILE",
                   help="a history database written by `traceml-ci record` (SQLite)")
    p.add_argument("--name", metavar="NAME", help="only the series with this run name / key")
    p.add_argument("--branch", metavar="NAME",
                   help="with --db: only runs recorded with this --branch")
    p.add_argument("--last", metavar="N", type=whole("--last", least=1),
                   help="with --db: only the newest N recorded runs (after --name/--branch)")
    p.add_argument("--format", choices=("markdown", "csv"), default="markdown",
                   help="markdown: trend per metric; csv: one row per run (default: markdown)")
    p.add_argument("--tolerances", metavar="FILE", help="TOML rules file (see docs/gate.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.paths and not args.db:
        raise UsageError("history: give summary files or folders, or --db FILE")
    if args.db is None and (args.branch is not None or args.last is not None):
        raise UsageError("history: --branch and --last read a database: add --db FILE")

    from traceml_ci.gate.inputs.history import collect, collect_db, render_history, sort_points
    from traceml_ci.gate.rules import resolve_rules

    rules = resolve_rules(args.tolerances)
    runs = []
    if args.paths:
        runs += [p for p in collect(args.paths) if args.name is None or p.series == args.name]
    if args.db:
        runs += collect_db(args.db, name=args.name, branch=args.branch, last=args.last)
    if not runs:
        raise UsageError(f"history: no runs named {args.name!r}")
    sys.stdout.write(render_history(sort_points(runs), rules, output=args.format))
    return 0
