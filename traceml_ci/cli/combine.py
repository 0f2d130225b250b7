"""``traceml-ci combine RUN... --output FILE``: repeated runs of one job, as one summary."""

from __future__ import annotations

import argparse
import sys

from traceml_ci.summary.keys import SUMMARY_FILENAME


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "combine",
        help="combine repeated runs of one job into one summary (a steadier baseline or head)",
        description="Combine summaries of the same job run several times: each phase share "
        "becomes the mean over the runs, and their spread across runs joins the summary's "
        "noise, so `traceml-ci diff` can tell a real shift from a noisy runner. Each RUN is a "
        "final_summary.json or a folder holding one. Exit 2 on bad input.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument(
        "-o", "--output", metavar="FILE", help="write here (atomically) instead of stdout"
    )
    p.add_argument(
        "--allow-different-jobs", action="store_true",
        help="combine runs with different run names (a job is one run name on one kind of "
        "machine; different machines are always refused)",
    )
    p.set_defaults(func=run)


def _job(doc: dict) -> tuple[str, str]:
    """What makes runs the same job: the run name (the script, or the name given to init or
    --name) and the kind of machine (device type and model)."""
    from traceml_ci.summary.view import SummaryView

    v = SummaryView(doc)
    device = f"{v.env.get('device_type')} {v.env.get('device_name') or ''}".strip()
    return v.run_name, device


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from traceml_ci.errors import InputError
    from traceml_ci.fsutil import is_dir, missing, write_output
    from traceml_ci.gate.inputs.files import InputKind, read_input
    from traceml_ci.summary.repeats import combine_repeats, runs_of

    docs = []
    jobs: dict[str, tuple[str, str]] = {}
    count = 0
    for given in args.runs:
        path = Path(given)
        if is_dir(path):
            path = path / SUMMARY_FILENAME
            if missing(path):
                raise InputError(given, f"folder holds no {SUMMARY_FILENAME}")
        loaded = read_input(path)
        if loaded.kind is InputKind.SET:
            raise InputError(str(path), "is a baseline set; combine takes one run's summary each")
        (doc,) = loaded.summaries.values()
        try:
            count += len(runs_of(doc))
        except ValueError as exc:
            raise InputError(str(path), str(exc)) from None
        jobs[str(path)] = _job(doc)
        docs.append(doc)
    (first, (first_name, first_device)), *rest = jobs.items()
    for other, (name, device) in rest:
        if device != first_device:
            raise InputError(
                other,
                f"ran on {device!r}, {first} on {first_device!r}: "
                "combine repeated runs of one job on one kind of machine",
            )
        if name != first_name and not args.allow_different_jobs:
            raise InputError(
                other,
                f"is run {name!r}, {first} is run {first_name!r}: combine repeated runs of one "
                "job (--allow-different-jobs to combine them anyway)",
            )
    text = json.dumps(combine_repeats(docs), indent=1) + "\n"
    if args.output:
        write_output(args.output, text)
        print(f"combined {count} runs into {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
