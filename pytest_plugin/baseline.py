"""The baseline file: load it once (a bad file is a usage error), merge this run's summaries in.

Writes are atomic (temp file + ``os.replace``), so a reader never sees half a file. Merging is
read-modify-write, so it also takes an exclusive lock: POSIX ``flock`` on the baseline's folder
(the file itself is replaced on every write, so a lock on it would guard a stale inode; a lock
file would be left behind). Two sessions updating one baseline keep both their entries.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pytest_plugin.options import SetupError

Summaries = dict[str, dict[str, Any]]


class BaselineError(SetupError):
    """The baseline file cannot be used; the message names the file. Exit code 4 in pytest."""


def load_baseline(path: Path) -> Summaries:
    """The baseline's summaries by key; ``{}`` when the file does not exist yet. A path that
    cannot be looked at (a link loop, a folder that may not be traversed) is no missing file:
    reading it says why (pathlib's exists() answers False for a loop)."""
    from traceml_ci.errors import InputError
    from traceml_ci.fsutil import missing
    from traceml_ci.gate import read_baseline_set

    if missing(path):
        return {}
    try:
        return read_baseline_set(path)
    except InputError as exc:
        raise BaselineError(f"traceml: unusable baseline file {exc}") from None


def save_set(path: Path, summaries: Mapping[str, dict[str, Any]]) -> None:
    """Write ``summaries`` as a baseline set, replacing the file atomically."""
    from traceml_ci.gate import write_baseline_set

    write_baseline_set(path, summaries)


def merge_into(path: Path, summaries: Mapping[str, dict[str, Any]]) -> int:
    """Add or replace ``summaries`` in the baseline set at ``path`` (created if missing), under
    an exclusive lock; other entries are kept. Returns the number of entries in the file."""
    with _locked(path):
        merged = load_baseline(path)
        merged.update(summaries)
        save_set(path, merged)
    return len(merged)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the atomic replace still holds
        yield
        return
    folder = path.resolve().parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
