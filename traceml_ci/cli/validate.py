"""``traceml-ci validate FILE...``: is each file something ``diff`` accepts, and if not, why.

A file is judged as what it is: a traceml-ci summary (every schema problem, with its JSON path),
a baseline set (its header, then each entry, named by key) or a traceml-ai summary (readable and
mappable to ours). The same functions decide for ``diff``, so the two never disagree.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from traceml_ci.errors import ExitCode, one_line


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate",
        help="check summaries and baseline sets against the schema",
        description="Validate final_summary.json files (schemas/final_summary.schema.json), "
        "baseline sets written by the pytest plugin (each entry, named by key) and traceml-ai "
        "summaries (whether they map to ours). Exit 0 if all are valid; exit 2 listing each "
        "problem as FILE: [summaries[\"KEY\"]: ]JSON-PATH: reason.",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=run)


def check(path: str) -> tuple[str, list[str]]:
    """What the file at ``path`` is (for the "valid" line) and its problems (empty if valid)."""
    from traceml_ci.errors import InputError
    from traceml_ci.gate.inputs.files import (
        InputKind,
        check_summary,
        entry_where,
        input_kind,
        set_entries,
    )
    from traceml_ci.summary.io import read_json
    from traceml_ci.summary.schema import summary_problems

    try:
        doc = read_json(path)
        kind = input_kind(doc) if isinstance(doc, dict) else InputKind.SUMMARY
        if kind is InputKind.SET:
            entries = set_entries(doc, path)
            problems: list[str] = []
            for key, entry in entries.items():
                try:
                    check_summary(entry, path, entry_where(key))
                except InputError as exc:
                    problems.append(exc.problem)
            return f"baseline set of {len(entries)} summaries", problems
        if kind is InputKind.TRACEML_AI:
            from traceml_ci.gate.inputs.traceml_ai import problems

            found = problems(doc)  # each field, as for ours (diff names the first)
            if found:
                return "", found
            mapped, _ = check_summary(doc, path)
            return _traceml_ai_note(doc, mapped), []
        return "", [str(p) for p in summary_problems(doc)]
    except InputError as exc:
        return "", [exc.problem]


def _traceml_ai_note(doc: dict[str, Any], mapped: dict[str, Any]) -> str:
    unmapped = (mapped.get("mapped_from") or {}).get("unmapped") or []
    note = f"traceml-ai summary, schema_version {doc.get('schema_version')}"
    return note + (f"; {len(unmapped)} fields have no counterpart" if unmapped else "")


def run(args: argparse.Namespace) -> int:
    bad = 0
    for path in args.files:
        what, problems = check(path)
        if problems:
            bad += 1
            for problem in problems:
                print(one_line(f"{path}: {problem}"), file=sys.stderr)
        else:
            print(one_line(f"{path}: valid" + (f" ({what})" if what else "")))
    return ExitCode.BAD_INPUT if bad else ExitCode.OK
