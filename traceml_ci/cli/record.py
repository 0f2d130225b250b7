"""``traceml-ci record SUMMARY... --db FILE``: append runs to a history database (SQLite)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "record",
        help="append summaries to a history database (SQLite) for `history --db`",
        description="Validate each summary (a final_summary.json, a baseline set: one run per "
        "key, or a traceml-ai summary) and append them all to the SQLite database FILE in one "
        "transaction (created if missing). A bad file records nothing. Safe for several jobs "
        "writing at once.",
    )
    p.add_argument("summaries", nargs="+", metavar="SUMMARY")
    p.add_argument("--db", metavar="FILE", required=True, help="the history database")
    p.add_argument("--commit", metavar="SHA", help="the commit the runs measured")
    p.add_argument("--branch", metavar="NAME", help="the branch the runs measured")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from traceml_ci.errors import InputError
    from traceml_ci.fsutil import is_dir
    from traceml_ci.gate import fmt
    from traceml_ci.gate.inputs.history import collect
    from traceml_ci.summary.store import record_runs

    for raw in args.summaries:  # files only: a folder's stray JSON would be skipped silently
        if is_dir(raw):
            raise InputError(raw, "is a folder: name the summary files to record")
    points = collect(args.summaries)  # every file read and validated before anything is written
    ids = record_runs(args.db, points, commit=args.commit, branch=args.branch)
    sys.stdout.write(f"recorded {len(ids)} run{'s' if len(ids) != 1 else ''} "
                     f"in {fmt.plain(args.db)}\n")
    return 0
