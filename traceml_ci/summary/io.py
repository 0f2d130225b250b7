"""Reading and writing summary files, with one clear error per bad file."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceml_ci.errors import InputError
from traceml_ci.fsutil import atomic_write_text
from traceml_ci.summary.schema import json_path, summary_problems

if TYPE_CHECKING:  # the model's dataclasses cost ~20 ms to import; readers don't need them
    from traceml_ci.summary.model import Summary

#: Summaries are a few KB; anything this large is not one (and is not read into memory).
MAX_SUMMARY_BYTES = 10 * 1024 * 1024


#: Longest string (or key) anywhere in a summary: run names, test ids and sentences are far
#: shorter; traceml-ai's longest, its rendered text, is ~5k.
MAX_STRING_CHARS = 64 * 1024

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


#: File types that are not regular files, as a message names them.
_NOT_REGULAR = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_text(path: str | os.PathLike[str], max_bytes: int) -> str:
    """A UTF-8 regular file of at most ``max_bytes``; InputError(path, problem) when it is
    missing, a directory, a stream or device (never read: ``/dev/zero`` would never end), too big
    (checked before reading, and again while reading), unreadable or not UTF-8."""
    p = Path(path)
    try:
        # Non-blocking, so opening a FIFO without a writer returns at once; the type check on
        # the open descriptor (not the name) leaves no window for a swap.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise InputError(str(p), "is a directory, not a file") from None
    except OSError as exc:
        raise InputError(str(p), f"cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(str(p), "is a directory, not a file")
        for is_kind, kind in _NOT_REGULAR:
            if is_kind(info.st_mode):
                raise InputError(str(p), f"is {kind}, not a regular file; save it to a file first")
        size = info.st_size
        if size <= max_bytes:
            raw = _read_at_most(fd, max_bytes + 1)  # +1: a file that grew (or /proc's size 0)
            size = max(size, len(raw))
    except OSError as exc:
        raise InputError(str(p), f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise InputError(
            str(p), f"file is {size / 1e6:.1f} MB, over the {max_bytes / 1e6:.0f} MB limit"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(str(p), "not UTF-8 text") from None


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


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


def read_json(path: str | os.PathLike[str], max_bytes: int = MAX_SUMMARY_BYTES) -> Any:
    """Parse a JSON file, raising InputError(path, problem) for every way it can be unusable."""
    p = Path(path)
    text = read_text(p, max_bytes)
    if not text.strip():
        raise InputError(str(p), "file is empty")
    try:
        doc = json.loads(
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
    # A file shorter than the limit cannot hold a longer string: summaries skip the walk.
    if len(text) > MAX_STRING_CHARS:
        problem = long_string_problem(doc, MAX_STRING_CHARS)
        if problem:
            raise InputError(str(p), f"{problem}, over the {MAX_STRING_CHARS:,}-character limit")
    return doc


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
