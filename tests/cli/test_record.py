"""``traceml-ci record`` and ``history --db``: the same history as from files, baseline sets one
row per key, bad input records nothing, and two processes recording at once lose nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import kill_all
from tests.gate.summaries import make, shift
from traceml_ci.cli.main import main
from traceml_ci.gate.inputs.files import write_baseline_set
from traceml_ci.summary.store import HistoryStore

REPO = Path(__file__).resolve().parents[2]


def _runs(folder: Path, n_before: int, n_after: int, name: str = "train") -> list[Path]:
    folder.mkdir(exist_ok=True)
    files = []
    for i in range(n_before + n_after):
        doc = make(shift(dataloader=4.0) if i >= n_before else None, name=name)
        doc["run"]["started_at"] = f"2026-11-{10 + i:02d}T08:00:00Z"
        files.append(folder / f"{name}-{i:02d}.json")
        files[-1].write_text(json.dumps(doc))
    return files


@pytest.mark.parametrize("fmt", ["markdown", "csv"])
def test_history_from_the_db_is_the_history_from_the_files(tmp_path, capsys, fmt):
    files = _runs(tmp_path / "runs", 3, 2) + _runs(tmp_path / "runs", 2, 0, name="eval")
    db = tmp_path / "h.sqlite"
    # recorded in two calls and out of order: history orders by run start, as for files
    assert main(["record", *map(str, files[3:]), "--db", str(db)]) == 0
    assert capsys.readouterr().out == f"recorded 4 runs in {db}\n"
    assert main(["record", *map(str, files[:3]), "--db", str(db), "--commit", "c0ffee"]) == 0
    capsys.readouterr()

    assert main(["history", "--format", fmt, str(tmp_path / "runs")]) == 0
    from_files = capsys.readouterr().out
    assert main(["history", "--format", fmt, "--db", str(db)]) == 0
    assert capsys.readouterr().out == from_files
    if fmt == "markdown":
        assert "train-03: 20.0% → 33.3% (+13.3 pp)" in from_files
        assert "### eval" in from_files


def test_history_db_filters_by_name_branch_and_last(tmp_path, capsys):
    files = _runs(tmp_path / "runs", 3, 2)
    other = _runs(tmp_path / "runs", 1, 0, name="eval")
    db = str(tmp_path / "h.sqlite")
    assert main(["record", *map(str, files[:4]), *map(str, other), "--db", db,
                 "--branch", "main"]) == 0
    assert main(["record", str(files[4]), "--db", db, "--branch", "pr-9"]) == 0
    capsys.readouterr()
    assert main(["history", "--db", db, "--name", "train", "--format", "csv"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 6 and all(r.startswith("train,") for r in rows[1:])
    assert main(["history", "--db", db, "--branch", "main", "--last", "2", "--format", "csv"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert [r.split(",")[1] for r in rows[1:]] == ["train-02", "train-03"]
    assert main(["history", "--db", db, "--branch", "nope"]) == 2
    err = capsys.readouterr().err
    assert err == f"traceml-ci: error: {db}: no runs recorded for branch 'nope'\n"


def test_a_baseline_set_records_one_run_per_key(tmp_path, capsys):
    path = tmp_path / "baselines.json"
    write_baseline_set(path, {"tests/a.py::t1": make(name="t1"), "tests/b.py::t2": make(name="t2")})
    db = tmp_path / "h.sqlite"
    assert main(["record", str(path), "--db", str(db)]) == 0
    with HistoryStore(db) as store:
        rows = store.runs()
    assert [(r.name, r.label, r.source) for r in rows] == [
        ("tests/a.py::t1", "baselines", str(path)), ("tests/b.py::t2", "baselines", str(path))]


def test_one_bad_file_records_nothing(tmp_path, capsys):
    good = _runs(tmp_path, 1, 0)[0]
    bad = tmp_path / "bad.json"
    doc = make()
    del doc["step_time"]["step_ms"]
    bad.write_text(json.dumps(doc))
    db = tmp_path / "h.sqlite"
    assert main(["record", str(good), str(bad), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"traceml-ci: error: {bad}: invalid summary: ") and err.count("\n") == 1
    assert not db.exists()

    assert main(["record", str(good), "--db", str(db)]) == 0
    assert main(["record", str(good), str(tmp_path / "missing.json"), "--db", str(db)]) == 2
    assert main(["record", str(tmp_path), "--db", str(db)]) == 2
    assert "is a folder: name the summary files" in capsys.readouterr().err
    with HistoryStore(db) as store:
        assert store.count() == 1


def test_history_needs_files_or_a_db(tmp_path, capsys):
    assert main(["history"]) == 2
    assert "give summary files or folders, or --db FILE" in capsys.readouterr().err
    assert main(["history", "--db", str(tmp_path / "none.sqlite")]) == 2
    assert capsys.readouterr().err.endswith("none.sqlite: no such history database\n")
    assert not (tmp_path / "none.sqlite").exists()
    assert main(["history", str(tmp_path), "--last", "3"]) == 2


def test_history_db_escapes_names_from_summaries(tmp_path, capsys):
    doc = make(name="x\n::error ::x\x1b[2J")
    (tmp_path / "evil.json").write_text(json.dumps(doc))
    db = str(tmp_path / "h.sqlite")
    assert main(["record", str(tmp_path / "evil.json"), "--db", db]) == 0
    for fmt in ("markdown", "csv"):
        assert main(["history", "--db", db, "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and not any(line.startswith("::") for line in out.splitlines())


_WRITER = """
import sys
import time
from pathlib import Path
from traceml_ci.cli.main import main
import traceml_ci.cli.record, traceml_ci.gate.inputs.history, traceml_ci.summary.store
db, me, other, files = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]

def meet(stage):  # wait until the other writer reaches the same stage
    me.with_suffix(stage).touch()
    while not other.with_suffix(stage).exists():
        time.sleep(0.001)

meet(".ready")  # both start recording at the same moment
for i, f in enumerate(files):  # one `record` (one transaction) per summary
    if i == len(files) // 2:
        meet(".half")  # and both are still writing after halfway
    assert main(["record", f, "--db", db]) == 0, f
"""


def test_two_processes_recording_at_once_lose_nothing(tmp_path):
    db = tmp_path / "h.sqlite"
    procs = []
    try:
        for w in range(2):
            files = _runs(tmp_path / f"w{w}", 50, 0, name=f"writer{w}")
            procs.append(subprocess.Popen(
                [sys.executable, "-c", _WRITER, str(db), str(tmp_path / f"writer{w}"),
                 str(tmp_path / f"writer{1 - w}"), *map(str, files)],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + 240
        while any(p.poll() is None for p in procs):  # one failing: stop, don't wait the other
            failed = [p for p in procs if p.poll() not in (None, 0)]
            assert not failed, failed[0].stderr.read()
            assert time.monotonic() < deadline, "writers still running after 240 s"
            time.sleep(0.05)
        for p in procs:
            assert p.returncode == 0, p.stderr.read()
    finally:
        kill_all(procs)
    with HistoryStore(db) as store:
        rows = store.runs()
    assert len(rows) == 100 and len({r.id for r in rows}) == 100
    for w in range(2):
        assert sorted(r.label for r in rows if r.name == f"writer{w}") == [
            f"writer{w}-{i:02d}" for i in range(50)]
    # they wrote at the same time: in id order, the writers take turns (at least at halfway)
    order = [r.name for r in sorted(rows, key=lambda r: r.id)]
    assert sum(a != b for a, b in zip(order[:-1], order[1:], strict=True)) > 1


def _files_state(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file in ``folder``: its bytes and modification time (ns)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def _one_error_line(capsys, *expected: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err


def test_a_foreign_sqlite_file_is_refused_byte_for_byte_unchanged(tmp_path, capsys):
    """Another application's database (rollback journal, as SQLite makes them): record and
    history --db refuse it before any pragma -- it used to be switched to WAL first."""
    import sqlite3

    summary = _runs(tmp_path / "runs", 1, 0)[0]
    app = tmp_path / "app"
    app.mkdir()
    foreign = app / "notes.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    conn.executemany("INSERT INTO notes (text) VALUES (?)", [(f"note {i}",) for i in range(200)])
    conn.commit()
    conn.close()
    before = _files_state(app)
    time.sleep(0.05)  # a write would move the modification time
    assert main(["record", str(summary), "--db", str(foreign)]) == 2
    _one_error_line(capsys, str(foreign), "not a traceml-ci history")
    assert main(["history", "--db", str(foreign)]) == 2
    _one_error_line(capsys, str(foreign), "not a traceml-ci history")
    assert _files_state(app) == before  # the file unchanged, and no -wal/-shm beside it
    assert sqlite3.connect(foreign).execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_a_damaged_history_is_refused_and_left_as_it_was(tmp_path, capsys):
    """Pages in the middle of our own database overwritten: record refuses it (quick_check
    before writing) rather than appending to it and exiting 0; history --db refuses it too."""
    files = _runs(tmp_path / "runs", 40, 0)
    db_dir = tmp_path / "db"
    db = db_dir / "h.sqlite"
    assert main(["record", *map(str, files), "--db", str(db)]) == 0
    capsys.readouterr()
    size = db.stat().st_size
    page = 4096
    assert size >= 8 * page and not (db_dir / "h.sqlite-wal").exists()
    with open(db, "r+b") as fh:  # two pages in the middle: old rows, which an append never reads
        fh.seek(size // page // 2 * page)
        fh.write(b"\xa5" * 2 * page)
    before = _files_state(db_dir)["h.sqlite"]
    time.sleep(0.05)
    assert main(["record", str(files[0]), "--db", str(db)]) == 2
    _one_error_line(capsys, str(db), "the history database is damaged", "nothing was written")
    assert main(["history", "--db", str(db)]) == 2
    _one_error_line(capsys, str(db), "damaged")
    # The database itself as it was (a WAL database read read-only keeps SQLite's -shm beside).
    assert _files_state(db_dir)["h.sqlite"] == before


def test_a_db_path_under_a_regular_file_is_one_line_exit_2(tmp_path, capsys):
    """``--db notes.txt/h.sqlite``: the folder cannot be made, one line naming the file in
    the way (was FileExistsError, exit 4)."""
    summary = _runs(tmp_path / "runs", 1, 0)[0]
    (tmp_path / "notes.txt").write_text("a file\n")
    for db in (tmp_path / "notes.txt" / "h.sqlite", tmp_path / "notes.txt" / "sub" / "h.sqlite"):
        assert main(["record", str(summary), "--db", str(db)]) == 2
        _one_error_line(capsys, str(db), f"{tmp_path / 'notes.txt'} is a file, not a folder")
    assert (tmp_path / "notes.txt").read_text() == "a file\n"


def _garble_a_row_in_place(db: Path, old: bytes, new: bytes) -> None:
    """Overwrite the bytes of one stored field on the table's page itself (a bit flip, a bad
    sector): the b-tree is intact, which is all ``PRAGMA quick_check`` looks at."""
    raw = db.read_bytes()
    at = raw.find(old)
    assert at > 0 and len(old) == len(new)
    db.write_bytes(raw[:at] + new + raw[at + len(old):])


def test_a_garbled_second_page_is_refused_before_anything_is_written(tmp_path, capsys):
    """One run in a history: its row on page 2, the runs table. A garbled run name there leaves
    a b-tree that quick_check passes, but the name index no longer agrees with the table: it was
    recorded into and read back, exit 0. integrity_check finds it: exit 2, nothing written."""
    import sqlite3

    files = _runs(tmp_path / "runs", 2, 0, name="trainrun")
    db_dir = tmp_path / "db"
    db = db_dir / "h.sqlite"
    assert main(["record", str(files[0]), "--db", str(db)]) == 0
    capsys.readouterr()
    page = 4096
    name_at = db.read_bytes().find(b"trainrun", page)
    assert page <= name_at < 2 * page  # the row lies on page 2
    _garble_a_row_in_place(db, b"trainrun", b"trXinrun")
    quick = sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute("PRAGMA quick_check")
    assert quick.fetchall() == [("ok",)]  # what the check before writing used to ask
    before = _files_state(db_dir)["h.sqlite"]
    time.sleep(0.05)
    assert main(["record", str(files[1]), "--db", str(db)]) == 2
    _one_error_line(capsys, str(db), "the history database is damaged", "nothing was written")
    assert main(["history", "--db", str(db)]) == 2
    _one_error_line(capsys, str(db), "damaged")
    assert _files_state(db_dir)["h.sqlite"] == before


@pytest.mark.parametrize(("old", "new"), [(b'"next_step": "', b'"next_step":\xff\xfe'),
                                          (b'"diagnoses": [', b'"diagnoses": }')],
                         ids=["not UTF-8", "not JSON"])
def test_a_summary_garbled_in_the_history_is_called_damaged(tmp_path, capsys, old, new):
    """A stored summary whose bytes are no longer UTF-8 text, or no longer JSON: the history
    reader names the run and says the database is damaged, one line, exit 2 (the text that
    would not decode was quoted whole, in SQLite's words)."""
    files = _runs(tmp_path / "runs", 1, 0)
    db = tmp_path / "h.sqlite"
    assert main(["record", str(files[0]), "--db", str(db)]) == 0
    capsys.readouterr()
    _garble_a_row_in_place(db, old, new)
    assert main(["history", "--db", str(db)]) == 2
    _one_error_line(capsys, str(db), "the history database is damaged", "run 1")


def test_a_history_in_a_read_only_folder_is_called_read_only_not_damaged(tmp_path):
    from tests.cli.denied import cli_denied

    files = _runs(tmp_path / "runs", 2, 0)
    folder = tmp_path / "ro"
    db = folder / "h.sqlite"
    assert main(["record", str(files[0]), "--db", str(db)]) == 0
    before = _files_state(folder)
    for path in (tmp_path, tmp_path / "runs", *files):
        path.chmod(0o755 if path.is_dir() else 0o644)
    db.chmod(0o644)
    folder.chmod(0o555)
    try:
        for argv in (("record", str(files[1]), "--db", str(db)),
                     ("history", "--db", str(db)),
                     ("record", str(files[1]), "--db", str(folder / "new.sqlite"))):
            done = cli_denied(*argv, cwd=tmp_path)
            lines = done.stderr.splitlines()
            assert (done.returncode, len(lines)) == (2, 1), done.stderr
            assert "read-only" in lines[0] and "damaged" not in lines[0], lines
    finally:
        folder.chmod(0o755)
    assert _files_state(folder) == before
