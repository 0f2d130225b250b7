"""A small JSON Schema (draft 2020-12) checker for the keywords our own schemas use.

``import jsonschema`` alone costs ~0.2 s, which would be most of ``traceml-ci diff``'s budget.
This interprets the same schema files for the subset of keywords they use, so the schemas stay
the single source of truth. A keyword it does not know raises :class:`Unsupported`, and callers
fall back to jsonschema; a test checks that both agree on generated documents.
``format`` is an annotation here (jsonschema checks ``date-time`` only when rfc3339-validator is
installed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

#: Keywords that only annotate; they never make a document invalid here.
_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "$defs",
        "title",
        "description",
        "examples",
        "default",
        "format",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_CHECKED = frozenset(
    {
        "type",
        "enum",
        "const",
        "required",
        "properties",
        "additionalProperties",
        "items",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "oneOf",
        "anyOf",
        "allOf",
        "$ref",
        "minProperties",
        "propertyNames",
    }
)


class Unsupported(Exception):
    """The schema uses a keyword this checker does not implement."""


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _type_ok(x: Any, name: str) -> bool:
    if name == "object":
        return isinstance(x, dict)
    if name == "array":
        return isinstance(x, list)
    if name == "string":
        return isinstance(x, str)
    if name == "number":
        return _is_number(x)
    if name == "integer":
        return (isinstance(x, int) and not isinstance(x, bool)) or (
            isinstance(x, float) and x.is_integer()
        )
    if name == "boolean":
        return isinstance(x, bool)
    if name == "null":
        return x is None
    raise Unsupported(f"type {name!r}")


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: booleans are not numbers, 1 == 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _path(parts: tuple[str | int, ...]) -> str:
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


def _show(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:39] + "…"


class Checker:
    """Validates documents against one schema (a dict loaded from a schema file)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.root = schema
        self._check_keywords(schema)

    def _check_keywords(self, node: Any) -> None:
        """Refuse, up front, a schema with keywords we would silently ignore."""
        if isinstance(node, bool):
            return
        if not isinstance(node, dict):
            raise Unsupported(f"schema node {node!r}")
        for key, value in node.items():
            if key in _ANNOTATIONS and key != "$defs":
                continue
            if key == "$defs":
                for sub in value.values():
                    self._check_keywords(sub)
            elif key not in _CHECKED:
                raise Unsupported(f"keyword {key!r}")
            elif key in ("properties",):
                for sub in value.values():
                    self._check_keywords(sub)
            elif key in ("additionalProperties", "items", "propertyNames"):
                self._check_keywords(value)
            elif key in ("oneOf", "anyOf", "allOf"):
                for sub in value:
                    self._check_keywords(sub)
            elif key == "$ref" and not str(value).startswith("#/"):
                raise Unsupported(f"non-local $ref {value!r}")

    def _resolve(self, ref: str) -> Any:
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def problems(self, doc: Any) -> list[tuple[str, str]]:
        """Every violation as (JSON path, message); empty when valid."""
        return list(self._iter(doc, self.root, ()))

    def is_valid(self, doc: Any) -> bool:
        return next(self._iter(doc, self.root, ()), None) is None

    def _iter(self, x: Any, s: Any, at: tuple[str | int, ...]) -> Iterator[tuple[str, str]]:
        if s is True:
            return
        if s is False:
            yield _path(at), "no value is allowed here"
            return
        if "$ref" in s:
            yield from self._iter(x, self._resolve(s["$ref"]), at)
        if "type" in s:
            types = s["type"] if isinstance(s["type"], list) else [s["type"]]
            if not any(_type_ok(x, t) for t in types):
                yield _path(at), f"{_show(x)} is not of type {' or '.join(map(repr, types))}"
                return
        if "enum" in s and not any(_equal(x, e) for e in s["enum"]):
            yield _path(at), f"{_show(x)} is not one of {s['enum']!r}"
        if "const" in s and not _equal(x, s["const"]):
            yield _path(at), f"{_show(x)} was expected to be {s['const']!r}"
        if _is_number(x):
            if "minimum" in s and x < s["minimum"]:
                yield _path(at), f"{_show(x)} is less than the minimum of {s['minimum']}"
            if "maximum" in s and x > s["maximum"]:
                yield _path(at), f"{_show(x)} is greater than the maximum of {s['maximum']}"
            if "exclusiveMinimum" in s and x <= s["exclusiveMinimum"]:
                yield _path(at), f"{_show(x)} must be greater than {s['exclusiveMinimum']}"
            if "exclusiveMaximum" in s and x >= s["exclusiveMaximum"]:
                yield _path(at), f"{_show(x)} must be less than {s['exclusiveMaximum']}"
        if isinstance(x, str):
            if "minLength" in s and len(x) < s["minLength"]:
                yield _path(at), f"{_show(x)} is shorter than {s['minLength']} characters"
            if "maxLength" in s and len(x) > s["maxLength"]:
                yield _path(at), f"{_show(x)} is longer than {s['maxLength']} characters"
            if "pattern" in s and not _regex(s["pattern"]).search(x):
                yield _path(at), f"{_show(x)} does not match {s['pattern']!r}"
        if isinstance(x, list):
            if "minItems" in s and len(x) < s["minItems"]:
                yield _path(at), f"expected at least {s['minItems']} items"
            if "maxItems" in s and len(x) > s["maxItems"]:
                yield _path(at), f"expected at most {s['maxItems']} items"
            if "items" in s:
                for i, item in enumerate(x):
                    yield from self._iter(item, s["items"], (*at, i))
        if isinstance(x, dict):
            for key in s.get("required", ()):
                if key not in x:
                    yield _path(at), f"{key!r} is a required property"
            if "minProperties" in s and len(x) < s["minProperties"]:
                n = s["minProperties"]
                yield (
                    _path(at),
                    ("must not be empty" if n == 1 else f"expected at least {n} properties"),
                )
            props = s.get("properties", {})
            for key, value in x.items():
                if key in props:
                    yield from self._iter(value, props[key], (*at, key))
                elif "additionalProperties" in s:
                    extra = s["additionalProperties"]
                    if extra is False:
                        yield _path(at), f"unknown key {key!r}"
                    else:
                        yield from self._iter(value, extra, (*at, key))
                if "propertyNames" in s:
                    yield from self._iter(key, s["propertyNames"], (*at, key))
        for sub in s.get("allOf", ()):
            yield from self._iter(x, sub, at)
        if "anyOf" in s and not any(self._ok(x, sub) for sub in s["anyOf"]):
            yield _path(at), f"{_show(x)} matches none of the allowed forms"
        if "oneOf" in s:
            matched = sum(self._ok(x, sub) for sub in s["oneOf"])
            if matched != 1:
                yield (
                    _path(at),
                    (
                        f"{_show(x)} matches none of the allowed forms"
                        if matched == 0
                        else f"{_show(x)} matches more than one allowed form"
                    ),
                )

    def _ok(self, x: Any, s: Any) -> bool:
        return next(self._iter(x, s, ()), None) is None


def schema_file(name: str) -> Path:
    """Where schema ``name`` lives: inside the wheel (traceml_ci/schemas/) or, in a checkout,
    the repository's schemas/. Plain paths, not importlib.resources, whose zip support costs
    a diff start-up several ms."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "schemas" / name
    return packaged if packaged.is_file() else package.parent / "schemas" / name


@cache
def checker_for(name: str) -> Checker:
    """The checker for one of the schemas shipped in schemas/ (cached per process)."""
    return Checker(json.loads(schema_file(name).read_text(encoding="utf-8")))
