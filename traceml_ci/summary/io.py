"""Reading and writing summary files, with one clear error per bad file."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceml_ci.errors import InputError
from traceml_ci.fsutil import atomic_write_text
from traceml_ci.summary.schema import summary_problems

if TYPE_CHECKING:  # the model's dataclasses cost ~20 ms to import; readers don't need them
    from traceml_ci.summary.model import Summary

#: Summaries are a few KB; anything this large is not one (and is not read into memory).
MAX_SUMMARY_BYTES = 10 * 1024 * 1024


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


def read_text(path: str | os.PathLike[str], max_bytes: int) -> str:
    """A UTF-8 text file of at most ``max_bytes`` (not read at all if larger); InputError
    (path, problem) when it is missing, a directory, unreadable, too big or not UTF-8."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise InputError(
                str(p), f"file is {size / 1e6:.1f} MB, over the {max_bytes / 1e6:.0f} MB limit"
            )
        raw = p.read_bytes()
    except InputError:
        raise
    except IsADirectoryError:
        raise InputError(str(p), "is a directory, not a file") from None
    except OSError as exc:
        raise InputError(str(p), f"cannot read: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(str(p), "not UTF-8 text") from None


def read_json(path: str | os.PathLike[str], max_bytes: int = MAX_SUMMARY_BYTES) -> Any:
    """Parse a JSON file, raising InputError(path, problem) for every way it can be unusable."""
    p = Path(path)
    text = read_text(p, max_bytes)
    if not text.strip():
        raise InputError(str(p), "file is empty")
    try:
        return json.loads(
            text, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int
        )
    except RecursionError:
        raise InputError(str(p), "JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            str(p), f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:
        raise InputError(str(p), str(exc)) from None


def load_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a traceml-ci final_summary.json; InputError names the first problem."""
    doc = read_json(path)
    problems = summary_problems(doc)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(str(path), f"invalid summary: {problems[0]}{more}")
    return doc


def write_summary(path: str | os.PathLike[str], summary: Summary | dict[str, Any]) -> Path:
    """Write a summary atomically (temp file + rename); returns the path written."""
    doc = summary if isinstance(summary, dict) else summary.to_dict()
    return atomic_write_text(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")
