"""The JSON Schemas shipped with traceml-ci, and validation of documents against them.

Two well-kept libraries, one schema file each: fastjsonschema's Python for the schema, generated
ahead of time (``schema_codegen.py``; compiled at run time only for a schema edited since),
confirms a valid document in microseconds, the diff's fast path; jsonschema (~0.2 s to import)
is asked only to word the problems of an invalid one. ``format`` is an annotation in both (as
draft 2020-12 says by default), so they judge alike; a property test keeps them in agreement.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from traceml_ci.summary.keys import SCHEMA_VERSION, phases_in

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
    """Where schema ``name`` lives: inside the wheel (traceml_ci/schemas/) or, from a source
    checkout or editable install, the repository's top-level schemas/. Plain paths, not
    importlib.resources, whose zip support costs a diff start-up several ms."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "schemas" / name
    return packaged if packaged.is_file() else package.parent / "schemas" / name


@cache
def load_schema(name: str) -> dict[str, Any]:
    return json.loads(schema_path(name).read_text(encoding="utf-8"))


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def json_path(parts: Iterable[str | int]) -> str:
    """A JSON path like ``$.step_time.forward_pct`` or ``$.tolerances["step_time.*_pct"]``."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.fullmatch(part):
            out += f".{part}"
        else:
            out += f"[{json.dumps(part)}]"
    return out


@cache
def fast_validator(name: str) -> tuple[Callable[[Any], Any], type[Exception]]:
    """Schema ``name`` compiled to a Python function (cached per process), and the exception
    it raises at a document's first problem (kept together: a test harness that re-imports
    fastjsonschema would otherwise bring a second class of that name).

    The function compiled ahead of time (``summary/schema_codegen.py``: a module imported in
    a few ms, no fastjsonschema) while it was generated from this very schema file; else
    fastjsonschema compiles the schema now (~0.15 s for the summary's).
    fastjsonschema writes a property's ``default`` into the document: keep ``default`` out of
    our schemas (a test checks validation leaves documents unchanged)."""
    ahead = _compiled_ahead(name)
    if ahead is not None:
        return ahead
    import fastjsonschema

    validate = fastjsonschema.compile(load_schema(name), use_formats=False)
    return validate, fastjsonschema.JsonSchemaValueException


def _compiled_ahead(name: str) -> tuple[Callable[[Any], Any], type[Exception]] | None:
    """The generated module's validator for schema ``name``, if it matches the schema file."""
    import hashlib
    import importlib

    from traceml_ci.summary.schema_codegen import COMPILED_SCHEMAS, module_name

    if name not in COMPILED_SCHEMAS:
        return None
    try:
        module = importlib.import_module(f"traceml_ci.summary.{module_name(name)}")
    except ImportError:
        return None
    digest = hashlib.sha256(schema_path(name).read_bytes()).hexdigest()
    if getattr(module, "SCHEMA_SHA256", None) != digest:
        return None
    return module.validate, module.JsonSchemaValueException


def is_valid(doc: Any, name: str) -> bool:
    """Whether ``doc`` is valid under schema ``name`` (the fast path: no jsonschema import)."""
    validate, invalid = fast_validator(name)
    try:
        validate(doc)
    except invalid:
        return False
    return True


def document_problems(doc: Any, name: str) -> list[Problem]:
    """Every violation of schema ``name`` in ``doc``, worded; empty when valid (fast path)."""
    return [] if is_valid(doc, name) else schema_problems(doc, name)


def schema_problems(doc: Any, name: str) -> list[Problem]:
    """Every violation of schema ``name`` in ``doc`` as jsonschema finds them, in document
    order, each once; an unknown key is named as one (``unknown key 'typo'``)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(load_schema(name))
    errors = sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    out: list[Problem] = []
    for e in errors:
        where = json_path(e.absolute_path)
        if e.validator == "additionalProperties" and e.validator_value is False:
            known = e.schema.get("properties", {})
            out += [Problem(where, f"unknown key {k!r}") for k in e.instance if k not in known]
        elif e.validator == "minProperties" and e.validator_value == 1:
            out.append(Problem(where, "must not be empty"))
        else:
            out.append(Problem(where, _short(e.message)))
    # A value two subschemas both check (allOf beside properties) fails both the same way.
    return list(dict.fromkeys(out))


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
    """The shares (five, with ``wait_pct`` and ``h2d_pct`` where present) add up to 100; all
    are null only when no step was analysed."""
    phases = phases_in(st)
    values = {p: st.get(f"{p}_pct") for p in phases}
    nulls = [p for p, v in values.items() if v is None]
    if len(nulls) == len(phases):
        analysed = st.get("steps_analyzed")
        if isinstance(analysed, int) and analysed > 0:
            return [
                Problem(
                    "$.step_time",
                    f"the five *_pct are null although {analysed} steps were analysed",
                )
            ]
        return []
    if nulls:
        return [
            Problem(
                f"$.step_time.{p}_pct",
                "is null while other shares are numbers (null only when no step was analysed)",
            )
            for p in nulls
        ]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values.values()):
        total = math.fsum(values.values())  # type: ignore[arg-type]
        if abs(total - 100.0) > PCT_SUM_TOLERANCE:
            return [Problem("$.step_time", f"the five *_pct add up to {total:g}, not 100")]
    return []


def summary_problems(doc: Any) -> list[Problem]:
    """Schema and semantic problems of a final_summary.json document; empty when valid.

    A valid document is confirmed by the compiled schema alone; jsonschema (~0.2 s to import)
    is asked only to word the problems of an invalid one.
    """
    if not isinstance(doc, dict):
        return [Problem("$", f"expected a JSON object, got {json_type(doc)}")]
    semantic = semantic_problems(doc)
    version_problems = [p for p in semantic if p.path == "$.schema_version"]
    if version_problems:
        # A newer major may have changed anything: schema errors would only be noise.
        return version_problems
    return document_problems(doc, SUMMARY_SCHEMA) + semantic


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
