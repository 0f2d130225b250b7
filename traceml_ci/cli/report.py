"""``traceml-ci report RUN_OR_DIR... -o report.html``: one self-contained HTML file of charts.

One input: its run (or each job of a baseline set). Two inputs: BASE and HEAD compared, as
``diff`` does, drawn side by side. Three or more: each run, and the trend across them in the
order given. ``--db FILE``: the runs recorded in a history database (``traceml-ci record``),
oldest first, drawn as runs and their trend. The page is built by
traceml_ci/gate/render/html.py (matplotlib, the ``report`` extra), imported only when this
command runs.
"""

from __future__ import annotations

import argparse
import sys

from traceml_ci.cli.options import whole
from traceml_ci.errors import ExitCode, InputError, MissingDependencyError, install_hint
from traceml_ci.summary.keys import SUMMARY_FILENAME

MATPLOTLIB_MISSING = ("the HTML report draws with matplotlib, which is not installed: "
                      f"{install_hint('report')}")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="write one self-contained HTML file of charts",
        description=(
            "Write one HTML file (no script, nothing fetched at view time) with, per run or "
            "job, the phase split as stacked bars, the step time distribution, the memory "
            "peaks and the diagnoses. Two inputs are compared as BASE and HEAD (as with diff) "
            "and drawn side by side; three or more also get the trend of each phase's share "
            "and of step time, in the order given. Inputs: final_summary.json files, folders "
            f"holding {SUMMARY_FILENAME}, baseline sets or traceml-ai summaries."
        ),
    )
    p.add_argument("inputs", nargs="*", metavar="RUN_OR_DIR", help="summaries or run folders")
    p.add_argument("--db", metavar="FILE",
                   help="also draw the runs recorded in this history database (traceml-ci "
                   "record), oldest first, after the inputs: their trend")
    p.add_argument("--name", help="with --db: only this series (run name or baseline key)")
    p.add_argument("--branch", help="with --db: only runs recorded on this branch")
    p.add_argument("--last", type=whole("--last", least=1), metavar="N",
                   help="with --db: the newest N runs")
    p.add_argument("-o", "--output", metavar="FILE", default="report.html",
                   help="the HTML file to write, atomically (default: report.html)")
    p.add_argument("--title", default="traceml-ci report", help="the page's title")
    p.add_argument("--tolerances", metavar="FILE",
                   help="TOML rules for comparing two inputs (as with diff)")
    p.add_argument("--allow-env-mismatch", action="store_true",
                   help="compare absolute times and memory across device types (as with diff)")
    p.set_defaults(func=run)


def _load(given: str) -> tuple[str, dict[str, dict]]:
    from pathlib import Path

    from traceml_ci.fsutil import is_dir, missing
    from traceml_ci.gate.inputs.files import read_input

    path = Path(given)
    if is_dir(path):
        path = path / SUMMARY_FILENAME
        if missing(path):
            raise InputError(given, f"folder holds no {SUMMARY_FILENAME}")
    return str(path), read_input(path).summaries


def run(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401 -- the one optional dependency, checked up front
    except ImportError:
        raise MissingDependencyError(MATPLOTLIB_MISSING) from None
    from traceml_ci.fsutil import write_output
    from traceml_ci.gate.render.html import Run, build_html

    loaded = [_load(x) for x in args.inputs]
    if args.db:
        from traceml_ci.gate.inputs.history import collect_db

        points = collect_db(args.db, name=args.name, branch=args.branch, last=args.last)
        loaded += [(f"{args.db} ({p.label})", {p.series: p.summary}) for p in points]
    elif not loaded:
        from traceml_ci.errors import UsageError

        raise UsageError("give RUN_OR_DIR inputs, or --db FILE")
    if len(loaded) == 2 and not args.db:
        from traceml_ci.gate.judge import judge
        from traceml_ci.gate.rules import resolve_rules

        (bpath, bsums), (hpath, hsums) = loaded
        result = judge(bsums, hsums, resolve_rules(args.tolerances),
                       allow_env_mismatch=args.allow_env_mismatch)
        base = [Run(k, bpath, d) for k, d in bsums.items()]
        head = [Run(k, hpath, d) for k, d in hsums.items()]
        page = build_html(head, base=base, comparison=result, title=args.title)
    else:
        runs = [Run(key, path, doc) for path, sums in loaded for key, doc in sums.items()]
        page = build_html(runs, title=args.title)
    write_output(args.output, page)
    # On stderr, as diff and combine say theirs: -o /dev/stdout is the page alone.
    print(f"wrote {args.output} ({len(page.encode()) / 1024:,.0f} KB)", file=sys.stderr)
    return ExitCode.OK
