"""A command started with stdout closed (``traceml-ci show x.json >&-``): no crash, no
traceback; what it would print is lost, so it exits 141 as on a closed pipe, while a command
that prints nothing to stdout keeps its own code (README's exit-code table)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gate.summaries import DATA

REPO = Path(__file__).resolve().parents[2]
A = str(DATA / "input_bound_a.json")


def _cli(*argv: str, cwd: Path, stdout: int | None = None,
         preexec_fn: Any = None) -> subprocess.CompletedProcess[str]:
    """``traceml-ci ARGV`` in a child, its stderr captured; ``stdout`` (a file descriptor; None:
    ours) and ``preexec_fn`` as ``subprocess.run`` takes them."""
    return subprocess.run(
        [sys.executable, "-m", "traceml_ci", *argv],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=preexec_fn,
    )


def _closed_stdout(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``traceml-ci ARGV >&-``: the child starts with fd 1 closed."""
    return _cli(*argv, cwd=cwd, preexec_fn=lambda: os.close(1))


@pytest.mark.parametrize(
    "argv",
    [
        ["show", A],
        ["diff", A, A],
        ["validate", A],
        ["combine", A, A],
        ["history", A],
        ["--version"],
    ],
    ids=lambda a: a[0],
)
def test_printing_to_a_closed_stdout_is_141_without_a_traceback(tmp_path, argv):
    done = _closed_stdout(*argv, cwd=tmp_path)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert done.stderr == ""


def test_a_command_that_prints_nothing_to_stdout_keeps_its_code(tmp_path):
    done = _closed_stdout("diff", A, A, "-o", str(tmp_path / "report.txt"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("traceml-ci: pass (report in ")
    assert (tmp_path / "report.txt").read_text().strip()


def test_run_with_stdout_closed_does_not_kill_the_script(tmp_path):
    """The script's prints go nowhere, as they would have; it is not killed by a closed pipe
    and its exit code is run's."""
    (tmp_path / "talk.py").write_text(
        "for i in range(1000):\n    print('line', i)\nraise SystemExit(3)\n"
    )
    done = _closed_stdout(
        "run", "--no-live", "--out", str(tmp_path / "out"), "talk.py", cwd=tmp_path
    )
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("argv", [["show", A], ["diff", A, A]], ids=lambda a: a[0])
def test_a_pipe_closed_by_its_reader_is_141_not_rich_s_exit_1(tmp_path, argv):
    """``traceml-ci show x.json | head -0``: rich answers a broken pipe with SystemExit(1), which
    main() took for a bug (4); it is the closed-pipe ending, 141, like diff's."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = _cli(*argv, cwd=tmp_path, stdout=write_end)
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""
