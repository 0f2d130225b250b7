"""The JSON Schemas shipped with traceml-ci, and validation of documents against them.

jsonschema is imported lazily: it costs ~0.2 s, which only the paths that validate should pay.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from traceml_ci.summary.keys import PHASES, SCHEMA_VERSION

SUMMARY_SCHEMA = "final_summary.schema.json"

#: Tolerance on the five step-time percentages adding up to 100.
PCT_SUM_TOLERANCE = 0.1


@dataclass(frozen=True)
class Problem:
    """Why a document is invalid, and where (a JSON path like ``$.step_time.forward_pct``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def schema_path(name: str) -> Path:
    """Where schema ``name`` lives: inside the wheel (traceml_ci/schemas) or, from a source
    checkout or editable install, the repository's top-level schemas/ folder."""
    from traceml_ci.summary.fastschema import schema_file

    return schema_file(name)


@cache
def load_schema(name: str) -> dict[str, Any]:
    return json.loads(schema_path(name).read_text(encoding="utf-8"))


def _json_path(parts: Any) -> str:
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def schema_problems(doc: Any, name: str) -> list[Problem]:
    """Every violation of schema ``name`` in ``doc``, in document order."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(
        load_schema(name), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    errors = sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    return [Problem(_json_path(e.absolute_path), _short(e.message)) for e in errors]


def _short(message: str, limit: int = 160) -> str:
    """jsonschema quotes whole offending values; keep one line readable."""
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 1] + "…"


def major(version: str) -> int | None:
    head = str(version).split(".", 1)[0]
    return int(head) if head.isdigit() else None


def semantic_problems(doc: dict[str, Any]) -> list[Problem]:
    """What a schema cannot say: the schema version is one we read, and the shares add up to
    100 (null only all together, when no step was analysed)."""
    problems: list[Problem] = []
    version = doc.get("schema_version")
    ours = major(SCHEMA_VERSION)
    theirs = major(version) if isinstance(version, str) else None
    if theirs is not None and ours is not None and theirs > ours:
        problems.append(
            Problem(
                "$.schema_version",
                f"schema version {version} is newer than this "
                f"traceml-ci reads ({SCHEMA_VERSION}); upgrade traceml-ci",
            )
        )
    st = doc.get("step_time")
    if isinstance(st, dict):
        problems += _share_problems(st)
    return problems


def _share_problems(st: dict[str, Any]) -> list[Problem]:
    """The five shares add up to 100; all five are null only when no step was analysed."""
    values = {p: st.get(f"{p}_pct") for p in PHASES}
    nulls = [p for p, v in values.items() if v is None]
    if len(nulls) == len(PHASES):
        analysed = st.get("steps_analyzed")
        if isinstance(analysed, int) and analysed > 0:
            return [Problem("$.step_time", f"the five *_pct are null although {analysed} steps "
                            "were analysed")]
        return []
    if nulls:
        return [Problem(f"$.step_time.{p}_pct", "is null while other shares are numbers (null "
                        "only when no step was analysed)") for p in nulls]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values.values()):
        total = math.fsum(values.values())  # type: ignore[arg-type]
        if abs(total - 100.0) > PCT_SUM_TOLERANCE:
            return [Problem("$.step_time", f"the five *_pct add up to {total:g}, not 100")]
    return []


def summary_problems(doc: Any) -> list[Problem]:
    """Schema and semantic problems of a final_summary.json document; empty when valid.

    A valid document is confirmed by the fast checker alone; jsonschema (~0.2 s to import) is
    asked only to word the problems of an invalid one.
    """
    from traceml_ci.summary.fastschema import Unsupported, checker_for

    if not isinstance(doc, dict):
        return [Problem("$", f"expected a JSON object, got {json_type(doc)}")]
    semantic = semantic_problems(doc)
    version_problems = [p for p in semantic if p.path == "$.schema_version"]
    if version_problems:
        # A newer major may have changed anything: schema errors would only be noise.
        return version_problems
    try:
        if not checker_for(SUMMARY_SCHEMA).problems(doc):
            return semantic
    except Unsupported:
        pass
    return schema_problems(doc, SUMMARY_SCHEMA) + semantic


def json_type(x: Any) -> str:
    """How a JSON value is named in error messages ("a JSON array", ...)."""
    if isinstance(x, list):
        return "a JSON array"
    if isinstance(x, str):
        return "a JSON string"
    if isinstance(x, bool):
        return "a JSON boolean"
    if x is None:
        return "JSON null"
    return "a JSON number"
