"""Reading and writing summary files, with one clear error per bad file."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceml_ci.errors import InputError
from traceml_ci.fsutil import atomic_write_text, read_text  # read_text: re-exported
from traceml_ci.summary.schema import json_path, summary_problems

if TYPE_CHECKING:  # the model's dataclasses cost ~20 ms to import; readers don't need them
    from traceml_ci.summary.model import Summary

#: Summaries are a few KB; anything this large is not one (and is not read into memory).
MAX_SUMMARY_BYTES = 10 * 1024 * 1024


#: Longest string (or key) anywhere in a summary: run names, test ids and sentences are far
#: shorter; traceml-ai's longest, its rendered text, is ~5k.
MAX_STRING_CHARS = 64 * 1024

#: The other inputs' limits, each far above what a real one holds (and all read through
#: ``read_text``: regular files only, size checked before and while reading).
#: A comment body (markdown): GitHub keeps 65,536 characters; a longer one is cut with a note.
MAX_COMMENT_BODY_BYTES = 10 * 1024 * 1024
#: ``comment --meta``'s comment.json: five short fields.
MAX_META_BYTES = 64 * 1024
#: A GitHub event payload (GITHUB_EVENT_PATH): GitHub caps webhook payloads at 25 MB.
MAX_EVENT_BYTES = 25 * 1024 * 1024

#: Numbers a summary can hold: finite, and within float range (1e400 would parse to inf).
_MAX_ABS = 1e308


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range (numbers must be finite)")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 308:
        raise ValueError(f"integer {text[:20]}... is out of range")
    return int(text)


class _Repeated(dict):  # type: ignore[type-arg]
    """A JSON object that held a key twice (``repeated``: the first such key)."""

    repeated: str


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's dict, marked when a key came twice: parsers keep either copy (Python the
    last), so which value a reader saw would be anyone's guess."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    marked = _Repeated(obj)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            marked.repeated = key
            break
        seen.add(key)
    return marked


def duplicate_key_problem(doc: Any) -> str | None:
    """Where ``doc`` (parsed by :func:`read_json`) held a key twice, as a one-line problem;
    None when no object did."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(doc, ())]
    while stack:
        node, where = stack.pop()
        if isinstance(node, _Repeated):
            return (f"duplicate key {node.repeated!r} in {json_path(where)[:200]} (a JSON "
                    "object holds each key once; which copy counts is anyone's guess)")
        if isinstance(node, dict):
            stack.extend((v, (*where, k)) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, (*where, i)) for i, v in reversed(list(enumerate(node))))
    return None


def long_string_problem(doc: Any, limit: int) -> str | None:
    """Where ``doc`` holds a string (or key) over ``limit`` characters, as a one-line problem;
    None when there is none. A summary's strings are names and sentences: megabytes of one are
    not data, and would only slow every reader and renderer down."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(doc, ())]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if len(key) > limit:
                    return f"a key in {json_path(where)[:200]} is {len(key):,} characters long"
                stack.append((value, (*where, key)))
        elif isinstance(node, list):
            stack.extend((v, (*where, i)) for i, v in enumerate(node))
        elif isinstance(node, str) and len(node) > limit:
            return f"the string at {json_path(where)[:200]} is {len(node):,} characters long"
    return None


def read_json(
    path: str | os.PathLike[str],
    max_bytes: int = MAX_SUMMARY_BYTES,
    *,
    max_string_chars: int | None = MAX_STRING_CHARS,
) -> Any:
    """Parse a JSON file, raising InputError(path, problem) for every way it can be unusable
    (``max_string_chars=None``: strings of any length, e.g. an event payload's PR body)."""
    p = Path(path)
    text = read_text(p, max_bytes)
    if not text.strip():
        raise InputError(str(p), "file is empty")
    repeated: list[bool] = []

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = _object(pairs)
        if isinstance(obj, _Repeated):
            repeated.append(True)
        return obj

    try:
        doc = json.loads(
            text, parse_constant=_reject_constant, parse_float=_finite_float,
            parse_int=_bounded_int, object_pairs_hook=pairs_hook,
        )
    except RecursionError:
        raise InputError(str(p), "JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            str(p), f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:
        raise InputError(str(p), str(exc)) from None
    if repeated:
        raise InputError(str(p), duplicate_key_problem(doc) or "a JSON object holds a key twice")
    # A file shorter than the limit cannot hold a longer string: summaries skip the walk.
    if max_string_chars is not None and len(text) > max_string_chars:
        problem = long_string_problem(doc, max_string_chars)
        if problem:
            raise InputError(str(p), f"{problem}, over the {max_string_chars:,}-character limit")
    return doc


def load_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a traceml-ci final_summary.json; InputError names the first problem."""
    doc = read_json(path)
    problems = summary_problems(doc)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(str(path), f"invalid summary: {problems[0]}{more}")
    return doc


#: An object or array whose one-line form fits in this many characters (less its indent) is
#: written on one line.
INLINE_CHARS = 120
#: A record (an object of plain values: a module's row, a line's count) up to this long too:
#: one line a record reads best, and a long name would spread it over four.
RECORD_CHARS = 2 * INLINE_CHARS
#: Within a line, json's compact separators: the file's lines and indents keep it readable.
SEPARATORS = (",", ":")


def summary_text(doc: dict[str, Any]) -> str:
    """A summary as written: indented by one space a level (``indent=1``), an object or array on
    one line where it fits in ``INLINE_CHARS`` (an op kind's ``[count, site]``, a short block)
    or a record in ``RECORD_CHARS`` (a module's row), and one whose items each fit, filled a
    line at a time (the op kinds, the
    settings): the same JSON, a third smaller, still read line by line."""
    if not _str_keys(doc):  # json's own key rules (None -> "null", True -> "true", ...)
        return json.dumps(doc, indent=1, allow_nan=False)
    return "".join(_text(doc, 0))


def _str_keys(value: Any) -> bool:
    """Whether every object in ``value`` has only ``str`` keys (what a summary has)."""
    if isinstance(value, dict):
        return all(type(k) is str for k in value) and all(_str_keys(v) for v in value.values())
    if isinstance(value, list):
        return all(_str_keys(v) for v in value)
    return True


def _text(value: Any, depth: int) -> Iterator[str]:
    if isinstance(value, (dict, list)) and value:
        flat = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=SEPARATORS)
        record = isinstance(value, dict) and not any(
            isinstance(v, (dict, list)) for v in value.values())
        if len(flat) <= (RECORD_CHARS if record else INLINE_CHARS) - depth:
            yield flat
            return
        pad, close = "\n" + " " * (depth + 1), "\n" + " " * depth
        opening, ending = ("{", "}") if isinstance(value, dict) else ("[", "]")
        keyed = isinstance(value, dict)
        pieces = [(json.dumps(k, ensure_ascii=True) + SEPARATORS[1] if keyed else "")
                  + json.dumps(v, ensure_ascii=True, allow_nan=False, separators=SEPARATORS)
                  for k, v in (value.items() if keyed else enumerate(value))]
        if max(len(p) for p in pieces) < INLINE_CHARS - depth:  # each fits: filled lines
            yield opening
            line = ""
            for i, piece in enumerate(pieces):
                piece += "," if i < len(pieces) - 1 else ""
                if line and len(line) + len(piece) > INLINE_CHARS - depth:
                    yield pad + line
                    line = piece
                else:
                    line += piece
            yield pad + line + close + ending
            return
        yield opening
        for i, (key, item) in enumerate(value.items() if keyed else enumerate(value)):
            yield ("," if i else "") + pad
            if keyed:
                yield json.dumps(key, ensure_ascii=True) + ": "
            yield from _text(item, depth + 1)
        yield close + ending
        return
    yield json.dumps(value, ensure_ascii=True, allow_nan=False)


def write_summary(path: str | os.PathLike[str], summary: Summary | dict[str, Any]) -> Path:
    """Write a summary atomically (temp file + rename); returns the path written."""
    doc = summary if isinstance(summary, dict) else summary.to_dict()
    return atomic_write_text(path, summary_text(doc) + "\n")
