"""Every numeric option of every command: NaN, inf, negative, zero where it means nothing, or
not a number at all is one line naming the option and exit 2, before anything runs
(``cli/options.py``); ``run -m`` of a module that is not there is like a missing script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gate.summaries import DATA
from traceml_ci.cli.main import main

REPO = Path(__file__).resolve().parents[2]
A = str(DATA / "input_bound_a.json")


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--module-sample-s", "inf", "x.py"],
        ["run", "--module-sample-s", "nan", "x.py"],
        ["run", "--progress-interval", "inf", "x.py"],
        ["run", "--progress-interval", "-1", "x.py"],
        ["run", "--warmup-steps", "-1", "x.py"],
        ["run", "--warmup-steps", "2.5", "x.py"],
        ["run", "--nproc-per-node", "0", "x.py"],
        ["run", "--nproc-per-node", "abc", "x.py"],
        ["run", "--nproc-per-node", "2", "--nnodes", "3:2", "x.py"],
        ["run", "--nproc-per-node", "2", "--node-rank", "-1", "x.py"],
        ["run", "--nproc-per-node", "2", "--master-port", "70000", "x.py"],
        ["show", A, "--width", "0"],
        ["show", A, "--width", "-5"],
        ["diff", A, A, "--width", "0"],
        ["history", A, "--last", "0"],
        ["report", A, "--last", "-2"],
        ["watch", "--interval", "nan"],
        ["watch", "--interval", "0"],
        ["watch", "--give-up", "inf"],
        ["watch", "--wait", "-1"],
        ["watch", "--wait", "inf"],
    ],
    ids=" ".join,
)
def test_a_bad_number_is_one_line_naming_the_option_exit_2(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("raise SystemExit('must not run')\n")
    assert main(argv) == 2
    out, err = capsys.readouterr()
    option = [a for a in argv if a.startswith("--")][-1]  # the bad one is the last given
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceml-ci: error: ")
    assert option in lines[0] and out == ""


def test_progress_interval_from_the_environment_must_be_finite(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("raise SystemExit('must not run')\n")
    monkeypatch.setenv("TRACEML_CI_PROGRESS_INTERVAL", "inf")
    assert main(["run", "x.py"]) == 2
    assert "$TRACEML_CI_PROGRESS_INTERVAL='inf'" in capsys.readouterr().err


def test_good_values_still_parse(capsys):
    assert main(["show", A, "--width", "40"]) == 0
    assert main(["diff", A, A, "--width", "200"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("module", "problem"),
    [
        ("nosuchmod", "no module named 'nosuchmod'"),
        ("json.nosuch", "no module named 'json.nosuch'"),
        ("mypkg.missing", "no module named 'mypkg.missing'"),
        ("json.decoder.x", "json.decoder is not a package"),
        ("bad-name", "not a module name"),
    ],
)
def test_run_m_of_a_missing_module_is_one_line_exit_2_like_a_missing_script(
    tmp_path, module, problem
):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("raise SystemExit('must not be imported')\n")
    done = subprocess.run(
        [sys.executable, "-m", "traceml_ci", "run", "--no-live", "-m", module],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"traceml-ci: error: -m {module}: {problem}"]


def test_run_m_finds_modules_in_the_working_folder_as_python_m_does(tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "job.py").write_text("import sys\nprint('job ran', sys.argv[1:])\n")
    (tmp_path / "top.py").write_text("print('top ran')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRACEML_CI_OUT": str(tmp_path / "out")}
    for argv, said in ((["-m", "mypkg.job", "a"], "job ran ['a']"), (["-m", "top"], "top ran")):
        done = subprocess.run(
            [sys.executable, "-m", "traceml_ci", "run", "--no-live", *argv],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        assert said in done.stdout
