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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from traceml_ci.errors import InputError
    from traceml_ci.fsutil import atomic_write_text
    from traceml_ci.gate.inputs import InputKind, read_input
    from traceml_ci.summary.repeats import combine_repeats

    docs = []
    devices: dict[str, str] = {}
    for given in args.runs:
        path = Path(given)
        if path.is_dir():
            path = path / SUMMARY_FILENAME
            if not path.is_file():
                raise InputError(given, f"folder holds no {SUMMARY_FILENAME}")
        loaded = read_input(path)
        if loaded.kind is InputKind.SET:
            raise InputError(str(path), "is a baseline set; combine takes one run's summary each")
        (doc,) = loaded.summaries.values()
        env = doc.get("env") or {}
        devices[str(path)] = f"{env.get('device_type')} {env.get('device_name') or ''}".strip()
        docs.append(doc)
    if len(set(devices.values())) > 1:
        first, *_ = devices
        other = next(p for p, d in devices.items() if d != devices[first])
        raise InputError(
            other,
            f"ran on {devices[other]!r}, {first} on {devices[first]!r}: "
            "combine repeated runs of one job on one kind of machine",
        )
    text = json.dumps(combine_repeats(docs), indent=1) + "\n"
    if args.output:
        atomic_write_text(args.output, text)
        print(f"combined {len(docs)} runs into {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
