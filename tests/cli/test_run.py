"""`traceml-ci run` for real: subprocesses, exit codes, crashes and signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.scripts import write_script
from tests.conftest import EXAMPLES
from traceml_ci.cli.main import main
from traceml_ci.summary.schema import summary_problems

CLI = [sys.executable, "-m", "traceml_ci"]


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "run", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _summary(out: Path) -> dict:
    doc = json.loads((out / "final_summary.json").read_text())
    assert summary_problems(doc) == []
    return doc


@pytest.mark.parametrize(
    ("example", "args", "label"),
    [
        ("input_bound.py", ["--steps", "60"], "INPUT_BOUND"),
        ("compute_bound.py", ["--steps", "40"], "COMPUTE_BOUND"),
    ],
)
def test_examples_get_their_diagnosis(tmp_path, example, args, label) -> None:
    out = tmp_path / "out"
    proc = _run(["--out", str(out), "--run-name", "demo", str(EXAMPLES / example), *args], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "done:" in proc.stdout  # the script's own output is untouched
    doc = _summary(out)
    assert doc["step_time"]["diagnosis"] == label
    assert doc["run"] == {**doc["run"], "name": "demo", "status": "completed", "mode": "auto"}


def test_zero_change_script_gets_a_summary_in_the_default_folder(tmp_path) -> None:
    proc = _run([str(EXAMPLES / "zero_change.py")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = _summary(tmp_path / "traceml-out")
    assert doc["run"]["mode"] == "zero-change"
    assert doc["run"]["name"] == "zero_change"
    assert doc["step_time"]["steps_total"] == 128  # 4096 samples / 32 per batch


def test_launcher_flags_win_over_the_scripts_init(tmp_path) -> None:
    script = write_script(tmp_path, "with_init.py")
    proc = _run(["--out", str(tmp_path / "o"), "--warmup-steps", "4", str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = _summary(tmp_path / "o")
    assert doc["run"]["name"] == "from-script"  # not fixed on the command line: the script's
    assert doc["step_time"]["warmup_steps"] == 4  # fixed on the command line: the launcher's


def test_exit_code_and_crash_status(tmp_path) -> None:
    proc = _run(["--out", str(tmp_path / "a"), str(write_script(tmp_path, "exit3.py"))], tmp_path)
    assert proc.returncode == 3
    assert _summary(tmp_path / "a")["run"]["status"] == "crashed"

    proc = _run(["--out", str(tmp_path / "b"), str(write_script(tmp_path, "crash.py"))], tmp_path)
    assert proc.returncode == 1
    assert "RuntimeError: diverged" in proc.stderr  # the user's traceback, as Python prints it
    doc = _summary(tmp_path / "b")
    assert doc["run"]["status"] == "crashed"
    assert doc["step_time"]["steps_total"] == 20


def _start_forever(tmp_path: Path, out: Path) -> tuple[subprocess.Popen, int]:
    script = write_script(tmp_path, "forever.py")
    proc = subprocess.Popen(
        [*CLI, "run", "--out", str(out), str(script)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("ready"), line + proc.stderr.read()
    return proc, int(line.split()[1])


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signals_give_interrupted(tmp_path, sig, code) -> None:
    out = tmp_path / "out"
    proc, _ = _start_forever(tmp_path, out)
    proc.send_signal(sig)  # to the launcher, which passes it on
    assert proc.wait(timeout=60) == code
    doc = _summary(out)
    assert doc["run"]["status"] == "interrupted"
    assert doc["step_time"]["steps_total"] >= 20


def test_killed_child_still_leaves_a_crashed_summary(tmp_path) -> None:
    out = tmp_path / "out"
    proc, child_pid = _start_forever(tmp_path, out)
    os.kill(child_pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == 137
    assert "ended without a summary" in proc.stderr.read()
    doc = _summary(out)
    assert doc["run"]["status"] == "crashed"
    assert doc["step_time"]["diagnosis"] == "INSUFFICIENT_DATA"


def test_missing_script_is_a_usage_error(tmp_path, capsys) -> None:
    assert main(["run", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"traceml-ci: error: {tmp_path / 'nope.py'}: no such script"
