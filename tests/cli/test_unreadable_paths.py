"""A summary or database under a folder the user may not traverse is bad input, one line and
exit 2, in every command that reads one -- never an internal error (pathlib's ``is_dir`` raised
PermissionError before the reader could say so)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.denied import cli_denied
from tests.gate.summaries import make


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/locked``, mode 000, holding a valid final_summary.json; a readable copy beside
    it as ``ok.json``."""
    folder = tmp_path / "locked"
    folder.mkdir()
    text = json.dumps(make(name="train"))
    (folder / "final_summary.json").write_text(text)
    (tmp_path / "ok.json").write_text(text)
    tmp_path.chmod(0o755)
    (tmp_path / "ok.json").chmod(0o644)
    folder.chmod(0)
    yield folder
    folder.chmod(0o755)


@pytest.mark.parametrize(
    "argv",
    [
        ("show", "locked/final_summary.json"),
        ("validate", "locked/final_summary.json"),
        ("diff", "ok.json", "locked/final_summary.json"),
        ("combine", "locked", "ok.json", "-o", "out.json"),
        ("combine", "locked/final_summary.json", "ok.json", "-o", "out.json"),
        ("record", "locked/final_summary.json", "--db", "h.db"),
        ("history", "locked/final_summary.json"),
        ("history", "--db", "locked/h.db"),
        ("report", "locked", "-o", "r.html"),
    ],
    ids=lambda argv: " ".join(argv),
)
def test_a_path_under_a_folder_that_cannot_be_traversed_is_one_line_exit_2(locked, argv):
    done = cli_denied(*argv, cwd=locked.parent)
    lines = done.stderr.splitlines()
    assert (done.returncode, len(lines)) == (2, 1), done.stderr
    assert "locked" in lines[0] and "Permission denied" in lines[0], lines
    assert "internal error" not in done.stderr
    assert not (locked.parent / "h.db").exists()  # a bad input records nothing
