"""What ``diff`` reads: a summary, a baseline set of summaries, or a traceml-ai summary.

Every way an input can be unusable raises ``InputError(path, problem)`` with one line that names
the problem. Validation (summary.schema) takes the fast path and asks jsonschema only to word an
error, so a valid pair of summaries is diffed without paying for ``import jsonschema``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from traceml_ci.errors import InputError
from traceml_ci.fsutil import atomic_write_text
from traceml_ci.summary.io import read_json, summary_text
from traceml_ci.summary.schema import json_type

#: Version of the baseline-set file format ``{"schema_version", "tool", "summaries": {...}}``.
BASELINE_SET_VERSION = "1.0"
SET_KEY = "summaries"


class InputKind(str, Enum):
    """What an input file held: one of our summaries, a baseline set, or traceml-ai's."""

    SUMMARY = "summary"
    SET = "set"
    TRACEML_AI = "traceml-ai"


@dataclass(frozen=True)
class LoadedInput:
    """One input file: what it was, and its summaries by key."""

    path: str
    kind: InputKind
    summaries: dict[str, dict[str, Any]]


def summary_problem(doc: Any) -> str | None:
    """The first problem of a traceml-ci summary document, or None when it is valid."""
    from traceml_ci.summary.schema import summary_problems

    problems = summary_problems(doc)
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}"


def check_summary(doc: Any, path: str, where: str = "") -> tuple[dict[str, Any], bool]:
    """Validate (or map) one summary; returns it and whether it was mapped from traceml-ai.
    InputError(path, "WHERE: problem") when it is unusable (``validate`` reports the same)."""
    from traceml_ci.gate.inputs import traceml_ai

    prefix = f"{where}: " if where else ""
    if isinstance(doc, dict) and traceml_ai.is_traceml_ai(doc):
        try:
            mapped = traceml_ai.map_summary(doc, path)
        except InputError as exc:
            raise InputError(path, prefix + exc.problem) from None
        problem = summary_problem(mapped)
        if problem:
            raise InputError(path, f"{prefix}could not map the traceml-ai summary: {problem}")
        return mapped, True
    problem = summary_problem(doc)
    if problem:
        raise InputError(path, f"{prefix}invalid summary: {problem}")
    return doc, False


def _key_for(summary: Mapping[str, Any], path: Path) -> str:
    from traceml_ci.summary.view import SummaryView

    return SummaryView(summary).run_name or path.stem


def input_kind(doc: Mapping[str, Any]) -> InputKind:
    """What a parsed input document is: the one place that tells sets, ours and traceml-ai's."""
    from traceml_ci.gate.inputs import traceml_ai

    if SET_KEY in doc and "step_time" not in doc:
        return InputKind.SET
    return InputKind.TRACEML_AI if traceml_ai.is_traceml_ai(doc) else InputKind.SUMMARY


def set_entries(doc: Mapping[str, Any], path: str) -> dict[str, Any]:
    """A baseline set's entries, unchecked, after checking its header (InputError if bad)."""
    from traceml_ci.summary.schema import major

    version = doc.get("schema_version")
    if not isinstance(version, str) or major(version) is None:
        raise InputError(
            path, f"baseline set: schema_version must be a string like {BASELINE_SET_VERSION!r}"
        )
    theirs, ours = major(version), major(BASELINE_SET_VERSION)
    if theirs is not None and ours is not None and theirs > ours:
        raise InputError(
            path,
            f"baseline set schema version {version} is newer than this "
            f"traceml-ci reads ({BASELINE_SET_VERSION}); upgrade traceml-ci",
        )
    summaries = doc.get(SET_KEY)
    if not isinstance(summaries, dict):
        raise InputError(path, f"baseline set: {SET_KEY!r} must be an object of summaries by key")
    return summaries


def entry_where(key: str) -> str:
    """How a set's entry is named in messages: ``summaries["key"]`` (JSON-escaped)."""
    return f"{SET_KEY}[{json.dumps(key)}]"


def _set_summaries(doc: dict[str, Any], path: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, summary in set_entries(doc, path).items():
        out[key], _ = check_summary(summary, path, entry_where(key))
    return out


def read_input(path: str | os.PathLike[str]) -> LoadedInput:
    """Read one input file, whatever its kind; InputError(path, problem) if it is unusable."""
    p = Path(path)
    doc = read_json(p)
    if not isinstance(doc, dict):
        raise InputError(
            str(p), f"expected a JSON object (a summary or a baseline set), got {json_type(doc)}"
        )
    if input_kind(doc) is InputKind.SET:
        return LoadedInput(str(p), InputKind.SET, _set_summaries(doc, str(p)))
    summary, mapped = check_summary(doc, str(p))
    kind = InputKind.TRACEML_AI if mapped else InputKind.SUMMARY
    return LoadedInput(str(p), kind, {_key_for(summary, p): summary})


def load_input(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Summaries by key: a single summary as ``{run name or file stem: summary}``, a baseline
    set as its ``summaries``, a traceml-ai summary mapped to ours (``mapped_from`` says what
    could not be mapped). Raises InputError(path, problem) for every bad input."""
    return read_input(path).summaries


def read_baseline_set(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The summaries of a baseline set file; InputError if the file is not a valid set."""
    p = Path(path)
    doc = read_json(p)
    if not isinstance(doc, dict) or SET_KEY not in doc:
        raise InputError(str(p), f"not a baseline set (expected an object with {SET_KEY!r})")
    return _set_summaries(doc, str(p))


def write_baseline_set(
    path: str | os.PathLike[str], summaries: Mapping[str, dict[str, Any]]
) -> None:
    """Write summaries as a baseline set, keys sorted, atomically (temp file + os.replace)."""
    from traceml_ci._version import __version__

    for key, summary in summaries.items():
        if not isinstance(key, str) or not isinstance(summary, Mapping):
            raise TypeError("a baseline set maps str keys to summary dicts")
    doc = {
        "schema_version": BASELINE_SET_VERSION,
        "tool": {"name": "traceml-ci", "version": __version__},
        SET_KEY: {k: dict(summaries[k]) for k in sorted(summaries)},
    }
    atomic_write_text(path, summary_text(doc) + "\n")  # as a summary is: half of indent=1
