"""An SQLite history of summaries (one file, stdlib ``sqlite3``): ``traceml-ci record`` appends
runs, ``traceml-ci history --db`` reads them back. Pure data and I/O: no gate, pandas or torch.

Several CI jobs may record into one database at once: the database is in WAL mode, each
:meth:`HistoryStore.record` call is one ``BEGIN IMMEDIATE`` transaction (all its rows or none),
and a writer waits up to ``timeout_s`` for another's lock instead of failing.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import stat
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from traceml_ci.errors import InputError
from traceml_ci.fsutil import is_dir, is_file, missing

T = TypeVar("T")

#: Version of the tables below, kept in SQLite's ``PRAGMA user_version``; bumped (with a
#: migration in :func:`_migrate`) when they change. A database from a newer traceml-ci is refused.
SCHEMA_VERSION = 1

#: The first 16 bytes of every SQLite 3 database file.
SQLITE_MAGIC = b"SQLite format 3\x00"

#: What a damaged history is called (nothing is written to it; a backup is the way back).
CORRUPT = ("the history database is damaged (nothing was written; restore it from a backup or "
           "start a new one)")

#: What a history SQLite may not write is called: in WAL mode even a reader needs to create the
#: ``-wal`` and ``-shm`` files beside the database, so its folder must be writable too.
READ_ONLY = ("the history database or its folder is read-only here (nothing was written; SQLite "
             "keeps its -wal and -shm files beside the database, so even reading one needs a "
             "writable folder)")

#: How long a writer waits for another writer's lock before giving up (seconds).
DEFAULT_TIMEOUT_S = 60.0

_SCHEMA_V1 = (
    """CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        recorded_at TEXT NOT NULL,   -- UTC, ISO 8601, when `record` wrote the row
        name TEXT NOT NULL,          -- the series: the run's name, or the baseline set's key
        label TEXT NOT NULL,         -- how `history` names the run (the file's stem or folder)
        started_at TEXT NOT NULL,    -- the summary's run.started_at ('' if none)
        source TEXT NOT NULL,        -- the file the summary was recorded from
        commit_sha TEXT,
        branch TEXT,
        summary TEXT NOT NULL        -- the summary document, JSON
    )""",
    "CREATE INDEX runs_by_name ON runs (name, started_at)",
    "CREATE INDEX runs_by_time ON runs (recorded_at)",
)


@dataclass(frozen=True)
class RunPoint:
    """One summary in a history: the series it belongs to (run name or baseline key), its
    label and start time, the file it came from, the document. What ``record`` stores and what
    ``history`` reads from files."""

    series: str
    label: str
    started_at: str
    path: str
    summary: dict[str, Any]


@dataclass(frozen=True)
class StoredRun:
    """One row of the ``runs`` table, its summary parsed."""

    id: int
    recorded_at: str
    name: str
    label: str
    started_at: str
    source: str
    commit: str | None
    branch: str | None
    summary: dict[str, Any]


def _text(s: str) -> str:
    """A string SQLite can store: lone surrogates (undecodable file names) as their escapes."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


class HistoryStore:
    """One open history database. ``create=False`` refuses a file that does not exist (readers);
    InputError(path, problem) for a file that is not a history database of a version we read."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.path, self.timeout_s = str(path), timeout_s
        p = Path(path)
        if is_dir(p):
            raise InputError(self.path, "is a folder, not a history database")
        if not create and missing(p):
            raise InputError(self.path, "no such history database")
        if create:
            _make_folder(p.parent, self.path)
        self._inspect(p)  # before anything that could change the file: ours, and whole?
        try:
            # isolation_level=None: no implicit transactions; record() opens its own.
            self._conn = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            if _read_only(exc, p):
                raise InputError(self.path, READ_ONLY) from None
            raise InputError(self.path, f"cannot open the history database: {exc}") from None
        try:
            self._setup(timeout_s)
        except BaseException:
            self._conn.close()
            raise

    def _inspect(self, p: Path) -> None:
        """Refuse, before any write or pragma that changes a file, one that is not ours to
        change: not a regular file, not SQLite, another application's SQLite database (its
        journal mode is left alone), a newer history, or a damaged one (``PRAGMA
        integrity_check``: a write would only spread the damage; ``quick_check`` passes a garbled
        row whose indexes no longer agree with it). Read through a read-only connection, which
        changes nothing in the file; a missing or empty file is a new history."""
        try:
            info = p.stat()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise InputError(self.path, f"cannot read: {exc.strerror or exc}") from None
        if not stat.S_ISREG(info.st_mode):
            raise InputError(self.path, "is not a regular file, so not a history database")
        if info.st_size == 0:
            return
        try:
            with open(p, "rb") as fh:
                magic = fh.read(len(SQLITE_MAGIC))
        except OSError as exc:
            raise InputError(self.path, f"cannot read: {exc.strerror or exc}") from None
        if magic != SQLITE_MAGIC:
            raise InputError(self.path, "is not an SQLite database, so not a traceml-ci history "
                                        "(left as it is)")
        uri = "file:" + urllib.parse.quote(str(p.resolve())) + "?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=self.timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise InputError(self.path, f"cannot open the history database: {exc}") from None
        try:
            # One read transaction: the version and the tables from one snapshot (another
            # process may be creating this very history, version and tables in one commit).
            conn.execute("BEGIN")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            ours = version >= 1 and "runs" in tables
            if not ours and (version or tables):  # someone else's: not even its journal mode
                raise InputError(self.path, "is an SQLite database, but not a traceml-ci "
                                            "history (left as it is)")
            if version > SCHEMA_VERSION:
                raise InputError(self.path, f"history database version {version} is newer "
                                 f"than this traceml-ci reads ({SCHEMA_VERSION}); upgrade "
                                 "traceml-ci")
            problems = [r[0] for r in conn.execute("PRAGMA integrity_check(3)")]
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                raise InputError(self.path, f"{exc} (waited {self.timeout_s:g} s)") from None
            if _read_only(exc, p):
                raise InputError(self.path, READ_ONLY) from None
            raise InputError(self.path, f"{CORRUPT}: {exc}") from None
        except sqlite3.DatabaseError as exc:  # "database disk image is malformed"
            raise InputError(self.path, f"{CORRUPT}: {exc}") from None
        finally:
            conn.close()
        if problems != ["ok"]:
            raise InputError(self.path, f"{CORRUPT}: {'; '.join(map(str, problems))[:300]}")

    def _setup(self, timeout_s: float) -> None:
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            self._retrying(self._setup_once)
        except sqlite3.OperationalError as exc:
            if _busy(exc):  # another writer held it for longer than we wait
                raise InputError(self.path, f"{exc} (waited {self.timeout_s:g} s)") from None
            if _read_only(exc, Path(self.path)):
                raise InputError(self.path, READ_ONLY) from None
            raise InputError(self.path, f"not a usable history database: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise InputError(self.path, f"not a usable history database: {exc}") from None

    def _setup_once(self) -> None:
        mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise InputError(self.path, f"cannot use WAL journal mode (got {mode})")
        self._conn.execute("PRAGMA synchronous = NORMAL")  # durable at each WAL checkpoint
        with self._transaction():
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            _migrate(self._conn, version, self.path)

    def _retrying(self, attempt: Callable[[], T]) -> T:
        """``attempt()``, tried again while SQLite answers busy, until ``timeout_s``. SQLite
        answers a lock that could deadlock (two connections turning a new file to WAL at once,
        each holding a read lock) with busy at once, without waiting on busy_timeout; every
        attempt here is a whole transaction, rolled back when it failed, so trying again is
        safe."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return attempt()
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() >= deadline:
                    raise
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                time.sleep(random.uniform(0.005, 0.05))  # jittered: the two must not re-collide

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        # IMMEDIATE takes the write lock at once: two writers queue on busy_timeout instead of
        # deadlocking on a read lock each wants to upgrade.
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def record(self, runs: Sequence[RunPoint], *, commit: str | None = None,
               branch: str | None = None, recorded_at: str | None = None) -> list[int]:
        """Append ``runs`` in one transaction (all or none); returns their row ids."""
        now = recorded_at or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        rows = [
            (now, _text(r.series), _text(r.label), _text(r.started_at), _text(r.path),
             None if commit is None else _text(commit), None if branch is None else _text(branch),
             json.dumps(r.summary, allow_nan=False, sort_keys=True))
            for r in runs
        ]

        def attempt() -> list[int]:
            ids = []
            with self._transaction():
                for row in rows:
                    cur = self._conn.execute(
                        "INSERT INTO runs (recorded_at, name, label, started_at, source, "
                        "commit_sha, branch, summary) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
                    ids.append(int(cur.lastrowid or 0))
            return ids

        try:
            return self._retrying(attempt)
        except sqlite3.Error as exc:
            if _read_only(exc, Path(self.path)):
                raise InputError(self.path, READ_ONLY) from None
            raise InputError(self.path, f"could not record: {exc}") from None

    def runs(self, *, name: str | None = None, branch: str | None = None,
             last: int | None = None) -> list[StoredRun]:
        """Stored runs, oldest first by (name, started_at, id); ``last``: the newest N per call
        (by started_at, then id), still returned oldest first."""
        where, params = [], []
        if name is not None:
            where.append("name = ?")
            params.append(_text(name))
        if branch is not None:
            where.append("branch = ?")
            params.append(_text(branch))
        # The summary as bytes, decoded in _stored: a garbled one is named by its run.
        sql = ("SELECT id, recorded_at, name, label, started_at, source, commit_sha, branch, "
               "CAST(summary AS BLOB) AS summary FROM runs"
               + (" WHERE " + " AND ".join(where) if where else ""))
        if last is not None:
            sql = f"SELECT * FROM ({sql} ORDER BY started_at DESC, id DESC LIMIT ?)"
            params.append(int(last))
        sql += " ORDER BY name, started_at, id"
        try:
            rows = self._conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "decode" in str(exc):  # a stored name no longer UTF-8: SQLite quotes it whole
                raise InputError(self.path, f"{CORRUPT}: a run's fields are not UTF-8 text "
                                            "any more") from None
            raise InputError(self.path, f"could not read: {exc}") from None
        except sqlite3.Error as exc:
            raise InputError(self.path, f"could not read: {exc}") from None
        return [self._stored(row) for row in rows]

    def _stored(self, row: tuple[Any, ...]) -> StoredRun:
        try:
            text = bytes(row[8]).decode("utf-8")
        except (UnicodeDecodeError, TypeError):
            raise InputError(self.path, f"{CORRUPT}: run {row[0]}: its summary is not UTF-8 "
                                        "text any more") from None
        try:
            doc = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise InputError(self.path, f"{CORRUPT}: run {row[0]}: its summary is not valid "
                                        f"JSON ({str(exc)[:120]})") from None
        if not isinstance(doc, dict):
            raise InputError(self.path, f"{CORRUPT}: run {row[0]}: its summary is not a JSON "
                                        "object")
        return StoredRun(int(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]),
                         str(row[5]), row[6], row[7], doc)

    def count(self) -> int:
        """How many runs the database holds."""
        return int(self._conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _make_folder(folder: Path, path: str) -> None:
    """Create the folder a new history goes in; InputError when it cannot be (a file where a
    folder of the path should be, no permission)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        taken = next((p for p in (folder, *folder.parents) if is_file(p)), folder)
        raise InputError(path, f"cannot create the history database: {taken} is a file, "
                               "not a folder") from None
    except OSError as exc:
        raise InputError(path, f"cannot create the history database's folder {folder}: "
                               f"{exc.strerror or exc}") from None


def _read_only(exc: sqlite3.Error, path: Path) -> bool:
    """Whether SQLite failed for want of a write where it may not write: the database file, or
    the folder its -wal, -shm and journal go in (SQLITE_READONLY, or it could not open a file in
    a folder that is not writable)."""
    name = str(getattr(exc, "sqlite_errorname", ""))  # Python 3.11+
    if name.startswith("SQLITE_READONLY") or "readonly database" in str(exc):
        return True
    if name.startswith("SQLITE_CANTOPEN") or "unable to open database file" in str(exc):
        return not os.access(path.parent or Path("."), os.W_OK)
    return False


def _busy(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


def _migrate(conn: sqlite3.Connection, version: int, path: str) -> None:
    """Bring the tables to :data:`SCHEMA_VERSION` (inside the caller's transaction)."""
    if version > SCHEMA_VERSION:
        raise InputError(path, f"history database version {version} is newer than this "
                               f"traceml-ci reads ({SCHEMA_VERSION}); upgrade traceml-ci")
    if version == 0:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        if tables:  # someone else's database: never add our tables to it
            raise InputError(path, "is an SQLite database, but not a traceml-ci history")
        for statement in _SCHEMA_V1:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def record_runs(path: str | os.PathLike[str], runs: Iterable[RunPoint], *,
                commit: str | None = None, branch: str | None = None) -> list[int]:
    """Open (or create) the database at ``path`` and append ``runs`` in one transaction."""
    with HistoryStore(path) as store:
        return store.record(list(runs), commit=commit, branch=branch)
