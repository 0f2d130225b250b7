"""``traceml-ci diff BASE HEAD`` (alias ``compare``): gate a head run against a baseline.

The one place a verdict -- stored-baseline or A/B -- becomes an exit code (:func:`exit_code`);
bad input is an InputError, which main() turns into exit 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from traceml_ci.cli import environment
from traceml_ci.cli.options import MIN_WIDTH, width
from traceml_ci.errors import ExitCode

if TYPE_CHECKING:  # pragma: no cover
    from traceml_ci.gate.compare import Comparison, SetComparison, Verdict

FORMATS = ("text", "markdown", "json")


def exit_code(verdict: Verdict, inconclusive: str = "pass") -> int:
    """pass and warn 0, regression 1, incomparable 3 (bad input is 2, raised as InputError);
    inconclusive (A/B) is no evidence of a regression: 0, unless ``inconclusive`` is "fail"
    (its own code, 7; docs/gate.md, "The rule")."""
    from traceml_ci.gate.results import Verdict  # the one definition; already loaded by diff

    verdict = Verdict(verdict)
    if verdict is Verdict.INCONCLUSIVE:
        return int(ExitCode.INCONCLUSIVE if inconclusive == "fail" else ExitCode.OK)
    return int({
        Verdict.PASS: ExitCode.OK,
        Verdict.WARN: ExitCode.OK,
        Verdict.REGRESSION: ExitCode.REGRESSION,
        Verdict.INCOMPARABLE: ExitCode.INCOMPARABLE,
    }[verdict])


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "diff",
        aliases=["compare"],
        help="compare a head summary with a baseline; exit 1 on regression",
        description=(
            "Compare HEAD with BASE metric by metric (phase shares, step time, memory, "
            "diagnoses) under tolerance rules, and print a report. BASE and HEAD are "
            "final_summary.json files, baseline sets written by the pytest plugin, or "
            "traceml-ai 0.5 summaries. Rules come from --tolerances FILE, else from "
            "[tool.traceml-ci] in the nearest pyproject.toml, else the defaults. "
            "Exit codes: 0 pass or warn, 1 regression, 2 bad input, 3 incomparable."
        ),
    )
    p.add_argument("base", metavar="BASE", help="baseline summary or baseline set")
    p.add_argument("head", metavar="HEAD", help="summary or set to check")
    p.add_argument(
        "--tolerances",
        metavar="FILE",
        help="TOML rules file (see docs/gate.md); overrides pyproject.toml",
    )
    p.add_argument(
        "--format", choices=FORMATS, default="text", help="report format (default: text)"
    )
    p.add_argument(
        "-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout"
    )
    p.add_argument(
        "--allow-env-mismatch",
        action="store_true",
        help="compare absolute times and memory even across device types, GPU "
        "models or torch major versions",
    )
    p.add_argument(
        "--width",
        type=width(),
        default=None,
        metavar="N",
        help=f"text width in columns, at least {MIN_WIDTH} (default: terminal width, else 120)",
    )
    p.set_defaults(func=run)


def render(result: Comparison | SetComparison, fmt: str, *, width: int, colour: bool) -> str:
    from traceml_ci.gate.render import comparison as r

    if fmt == "json":
        return r.render_json(result)
    if fmt == "markdown":
        return r.render_markdown(result)
    return r.render_text(result, width=width, colour=colour)


def run(args: argparse.Namespace) -> int:
    from traceml_ci.gate.inputs.files import read_input
    from traceml_ci.gate.judge import judge
    from traceml_ci.gate.rules import resolve_rules

    rules = resolve_rules(args.tolerances)
    base = read_input(args.base)
    head = read_input(args.head)
    result = judge(base.summaries, head.summaries, rules,
                   allow_env_mismatch=args.allow_env_mismatch)
    to_tty = args.output is None and sys.stdout.isatty()
    colour = environment.colour(to_tty)
    width = args.width or (os.get_terminal_size().columns if to_tty else 120)
    report = render(result, args.format, width=max(width, MIN_WIDTH), colour=colour)
    if args.output:
        from traceml_ci.fsutil import write_output
        from traceml_ci.gate.fmt import plain
        from traceml_ci.gate.render.comparison import shown_causes

        write_output(args.output, report)
        # The headline's first cause, when it names one (gate/causes.py), beside the verdict.
        cause = shown_causes(result)
        said = f": {plain(cause[0])}" if cause else ""
        print(
            f"traceml-ci: {result.verdict.value}{said} (report in {plain(args.output)})",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(report)
    return exit_code(result.verdict)
