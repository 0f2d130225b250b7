"""``traceml-ci validate FILE...``: check summaries against the JSON Schema."""

from __future__ import annotations

import argparse
import sys

EXIT_INVALID = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate",
        help="check final_summary.json files against the schema",
        description="Validate summaries against schemas/final_summary.schema.json. Exit 0 if "
        "all are valid; exit 2 listing each problem as FILE: JSON-PATH: reason.",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from traceml_ci.errors import InputError
    from traceml_ci.summary.io import read_json
    from traceml_ci.summary.schema import summary_problems

    bad = 0
    for path in args.files:
        try:
            problems = [str(p) for p in summary_problems(read_json(path))]
        except InputError as exc:
            problems = [exc.problem]
        if problems:
            bad += 1
            for problem in problems:
                print(f"{path}: {problem}", file=sys.stderr)
        else:
            print(f"{path}: valid")
    return EXIT_INVALID if bad else 0
