"""The SQLite history store: round trip, filters, one transaction per record, versions, and
files that are not a history database."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.conftest import kill_all
from tests.gate.summaries import make
from traceml_ci.errors import InputError
from traceml_ci.summary.store import SCHEMA_VERSION, HistoryStore, RunPoint, record_runs


def _run(name: str, day: int, label: str | None = None) -> RunPoint:
    doc = make(name=name)
    doc["run"]["started_at"] = f"2026-11-{day:02d}T08:00:00Z"
    return RunPoint(name, label or f"{name}-{day}", doc["run"]["started_at"], f"/x/{day}.json", doc)


def test_round_trip_keeps_every_field_and_orders_by_series_then_start(tmp_path):
    db = tmp_path / "h.sqlite"
    ids = record_runs(db, [_run("b", 12), _run("a", 11)], commit="abc", branch="main")
    record_runs(db, [_run("a", 10)], branch="pr-7")
    with HistoryStore(db, create=False) as store:
        rows = store.runs()
        assert store.count() == 3
    assert [(r.name, r.started_at[:10]) for r in rows] == [
        ("a", "2026-11-10"), ("a", "2026-11-11"), ("b", "2026-11-12")]
    b = rows[2]
    assert b.id == ids[0] and (b.commit, b.branch, b.label, b.source) == (
        "abc", "main", "b-12", "/x/12.json")
    assert b.summary == _run("b", 12).summary
    assert b.recorded_at.endswith("Z")
    assert rows[0].commit is None and rows[0].branch == "pr-7"


def test_filters_by_name_branch_and_last(tmp_path):
    db = tmp_path / "h.sqlite"
    record_runs(db, [_run("a", d) for d in (10, 11, 12, 13)], branch="main")
    record_runs(db, [_run("b", 14)], branch="main")
    record_runs(db, [_run("a", 15)], branch="pr")
    with HistoryStore(db) as store:
        assert [r.started_at[8:10] for r in store.runs(name="a")] == ["10", "11", "12", "13", "15"]
        assert [r.started_at[8:10] for r in store.runs(name="a", branch="main", last=2)] == [
            "12", "13"]
        assert [r.name for r in store.runs(branch="main", last=1)] == ["b"]
        assert store.runs(name="nobody") == []


class _FailSecondInsert:
    """A connection that fails the second INSERT, as a full disk or a crash would."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn, self.inserts = conn, 0

    def execute(self, sql: str, *params):
        if sql.startswith("INSERT"):
            self.inserts += 1
            if self.inserts == 2:
                raise sqlite3.OperationalError("disk I/O error")
        return self.conn.execute(sql, *params)


def test_a_record_is_one_transaction_all_rows_or_none(tmp_path):
    db = tmp_path / "h.sqlite"
    with HistoryStore(db) as store:
        store.record([_run("a", 1)])
        real = store._conn
        store._conn = _FailSecondInsert(real)  # type: ignore[assignment]
        with pytest.raises(InputError, match="could not record: disk I/O error"):
            store.record([_run("a", 2), _run("a", 3)])
        store._conn = real
        assert [r.started_at[8:10] for r in store.runs()] == ["01"]


def test_database_is_wal_with_a_versioned_schema(tmp_path):
    db = tmp_path / "h.sqlite"
    record_runs(db, [_run("a", 1)])
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {"runs_by_name", "runs_by_time"} <= indexes
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.commit()
    finally:
        conn.close()
    with pytest.raises(InputError, match=r"version 2 is newer than this traceml-ci reads \(1\)"):
        HistoryStore(db)


def test_refuses_files_that_are_not_a_history(tmp_path):
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(InputError, match="is an SQLite database, but not a traceml-ci history"):
        HistoryStore(other)
    assert sqlite3.connect(other).execute(
        "SELECT name FROM sqlite_master WHERE type='table'").fetchall() == [("t",)]

    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a database at all\n" * 100)
    with pytest.raises(InputError, match="is not an SQLite database"):
        HistoryStore(text)
    assert text.read_text().startswith("hello")

    with pytest.raises(InputError, match="is a folder"):
        HistoryStore(tmp_path)
    with pytest.raises(InputError, match="no such history database"):
        HistoryStore(tmp_path / "missing.sqlite", create=False)
    assert not (tmp_path / "missing.sqlite").exists()


def test_a_tampered_row_is_one_clear_error(tmp_path):
    db = tmp_path / "h.sqlite"
    record_runs(db, [_run("a", 1)])
    conn = sqlite3.connect(db)
    conn.execute("UPDATE runs SET summary = '{\"x\": NaN}'")
    conn.commit()
    conn.close()
    with HistoryStore(db) as store, pytest.raises(InputError, match="run 1: its summary is not"):
        store.runs()


def test_names_with_lone_surrogates_are_stored_escaped(tmp_path):
    db = tmp_path / "h.sqlite"
    run = _run("train_\udcff", 1)
    record_runs(db, [run])
    with HistoryStore(db) as store:
        (row,) = store.runs()
    assert row.name == "train_\\udcff"
    assert row.summary["run"]["name"] == "train_\udcff"  # the JSON keeps it exactly


def test_importing_the_store_loads_no_gate_pandas_or_torch():
    probe = ("import json, sys, traceml_ci.summary.store\n"
             "print(json.dumps([m for m in ('torch', 'pandas', 'numpy', 'traceml_ci.gate') "
             "if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(out.stdout) == []


_OPENER = """
import sys
import time
from pathlib import Path
from traceml_ci.summary.store import HistoryStore, RunPoint
db, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
while not go.exists():
    pass
with HistoryStore(db) as store:
    store.record([RunPoint("n", ready.name, "", "src", {})])
"""


def test_processes_creating_one_new_database_at_once_all_record(tmp_path):
    """Turning a new file to WAL from several connections at once can make SQLite answer busy
    without waiting (a lock upgrade that could deadlock): the store tries again."""
    for trial in range(6):
        folder = tmp_path / str(trial)
        folder.mkdir()
        db, go = folder / "h.sqlite", folder / "go"
        readies = [folder / f"ready{i}" for i in range(4)]
        procs = []
        try:
            for ready in readies:
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", _OPENER, str(db), str(ready), str(go)],
                    stderr=subprocess.PIPE, text=True))
            deadline = time.monotonic() + 60
            while not all(r.exists() for r in readies):
                assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
                time.sleep(0.01)
            go.touch()
            for p in procs:
                _, err = p.communicate(timeout=120)
                assert p.returncode == 0, err
        finally:
            kill_all(procs)
        with HistoryStore(db) as store:
            assert sorted(r.label for r in store.runs()) == [r.name for r in readies]
