"""`traceml-ci run` for real: subprocesses, exit codes, crashes and signals.

Tests that only check the launcher (exit codes, signals, -m) run scripts that never import
torch: the child then never imports it either, and each test starts in a fraction of a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.scripts import kill_group, run_group, write_script
from tests.conftest import EXAMPLES, sigint_default
from tests.pytest_plugin.shared import once_per_session
from traceml_ci.cli.main import main
from traceml_ci.summary.schema import summary_problems
from traceml_ci.summary.thresholds import Thresholds

CLI = [sys.executable, "-m", "traceml_ci"]


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_group([*CLI, "run", *args], cwd, timeout)


def _analysed_in(snap: Path) -> int:
    """Analysed steps in a live snapshot's window summary (0 while there is none)."""
    if not snap.exists():
        return 0
    doc = json.loads(snap.read_text() or "{}")
    return ((doc.get("window_summary") or {}).get("step_time") or {}).get("steps_analyzed") or 0


def _summary(out: Path) -> dict:
    doc = json.loads((out / "final_summary.json").read_text())
    assert summary_problems(doc) == []
    return doc


#: The examples' runs: example -> the launcher's options before the script, and the script's.
#: The module-sampling test reads the same runs (a torch process costs seconds): compute_bound
#: samples modules every 0.05 s (a sampled step's hooks are left out of the phase shares, so
#: its diagnosis stands), input_bound none (the default, every 0.5 s, samples its 60 steps).
#: (test_run_live traces input_bound with the defaults to its diagnosis.)
EXAMPLE_RUNS = {
    "input_bound.py": (["--module-sample-s", "0"], ["--steps", "60"]),
    "compute_bound.py": (["--module-sample-s", "0.05"], ["--steps", "40"]),
}


def _shared_run(tmp_path_factory: pytest.TempPathFactory, name: str,
                args: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    """``traceml-ci run --out OUT ARGS`` in a folder of its own, once per test session whichever
    test (xdist worker) asks first (a torch process costs seconds: the tests that read the same
    run share it): (the finished run, OUT)."""

    def produce() -> dict:
        cwd = tmp_path_factory.mktemp(name)
        proc = _run(["--out", str(cwd / "out"), *args], cwd)
        return {"out": str(cwd / "out"), "returncode": proc.returncode, "stdout": proc.stdout,
                "stderr": proc.stderr}

    data = once_per_session(tmp_path_factory, f"test_run_{name}", produce)
    done = subprocess.CompletedProcess(args, data["returncode"], data["stdout"], data["stderr"])
    return done, Path(data["out"])


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory: pytest.TempPathFactory):
    """example -> (its finished ``traceml-ci run``, its --out folder), each run once."""
    done: dict[str, tuple[subprocess.CompletedProcess, Path]] = {}

    def get(example: str) -> tuple[subprocess.CompletedProcess, Path]:
        if example not in done:
            launcher, script = EXAMPLE_RUNS[example]
            done[example] = _shared_run(
                tmp_path_factory, example.removesuffix(".py"),
                ["--run-name", "demo", *launcher, str(EXAMPLES / example), *script])
        return done[example]

    return get


@pytest.mark.parametrize(
    ("example", "label"),
    [("input_bound.py", "INPUT_BOUND"), ("compute_bound.py", "COMPUTE_BOUND")],
)
def test_examples_get_their_diagnosis(example_runs, example, label) -> None:
    proc, out = example_runs(example)
    assert proc.returncode == 0, proc.stderr
    assert "done:" in proc.stdout  # the script's own output is untouched
    doc = _summary(out)
    assert doc["step_time"]["diagnosis"] == label
    assert doc["run"] == {**doc["run"], "name": "demo", "status": "completed", "mode": "auto"}


def test_module_sampling_from_the_command_line(tmp_path, monkeypatch, capsys,
                                               example_runs) -> None:
    """--module-sample-s: a step timed per submodule that often (forward and backward), 0: none;
    a negative value is one line and exit 2, before anything runs."""
    script = str(EXAMPLES / "compute_bound.py")
    on, on_out = example_runs("compute_bound.py")  # --module-sample-s 0.05, 40 steps
    assert on.returncode == 0, on.stderr
    mods = _summary(on_out)["modules"]
    assert mods["sampled_steps"] >= 2 and mods["every_s"] == 0.05
    assert mods["forward"] and mods["backward"]
    off, off_out = example_runs("input_bound.py")  # --module-sample-s 0, 60 steps
    assert off.returncode == 0, off.stderr
    assert "modules" not in _summary(off_out)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["run", "--module-sample-s", "-1", script]) == 2  # in this process: nothing runs
    assert capsys.readouterr().err.strip().splitlines() == [
        "traceml-ci: error: --module-sample-s '-1': must be a finite number of seconds >= 0 "
        "(0: no module sampling)"]


def test_zero_change_script_gets_a_summary_in_the_default_folder(tmp_path) -> None:
    proc = _run([str(EXAMPLES / "zero_change.py")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = _summary(tmp_path / "traceml-out")
    assert doc["run"]["mode"] == "zero-change"
    assert doc["run"]["name"] == "zero_change"
    assert doc["step_time"]["steps_total"] == 128  # 4096 samples / 32 per batch
    assert proc.stderr.splitlines()[-1] == (
        "traceml-ci: summary written to traceml-out/final_summary.json"
    )


def test_launcher_flags_win_over_the_scripts_init_and_the_line_says_so(tmp_path) -> None:
    script = write_script(tmp_path, "with_init.py")  # init(out_dir='mine', warmup_steps=2, ...)
    out = tmp_path / "o"
    proc = _run(["--out", str(out), "--warmup-steps", "4", str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = _summary(out)
    assert doc["run"]["name"] == "from-script"  # not fixed on the command line: the script's
    assert doc["step_time"]["warmup_steps"] == 4  # fixed on the command line: the launcher's
    assert not (tmp_path / "mine").exists()
    assert proc.stderr.strip().splitlines() == [
        f"traceml-ci: summary written to {out / 'final_summary.json'} "
        "(traceml-ci run --out overrides the script's init(out_dir='mine'))"
    ]


def test_without_out_the_scripts_init_out_dir_is_used(tmp_path, monkeypatch) -> None:
    """TRACEML_CI_OUT set by the user is a default, like ./traceml-out: init(out_dir=) wins."""
    script = write_script(tmp_path, "with_init.py")
    env = {**os.environ, "TRACEML_CI_OUT": str(tmp_path / "env")}
    proc = run_group([*CLI, "run", str(script)], tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert _summary(tmp_path / "mine")["step_time"]["steps_total"] == 30
    assert "fallback" not in proc.stderr and not (tmp_path / "env").exists()
    assert proc.stderr.strip() == "traceml-ci: summary written to mine/final_summary.json"


def test_user_set_traceml_ci_out_is_where_the_summary_goes(tmp_path) -> None:
    env = {**os.environ, "TRACEML_CI_OUT": str(tmp_path / "env")}
    proc = run_group(
        [*CLI, "run", str(write_script(tmp_path, "plain_exit3.py"))], tmp_path, env=env
    )
    assert proc.returncode == 3, proc.stderr
    assert _summary(tmp_path / "env")["run"]["name"] == "plain_exit3"


def test_exit_code_and_crash_status(tmp_path) -> None:
    proc = _run(
        ["--out", str(tmp_path / "a"), str(write_script(tmp_path, "plain_exit3.py")), "x"], tmp_path
    )
    assert proc.returncode == 3
    assert proc.stdout == "hello ['x'] False\n"  # the child imported no torch either
    doc = _summary(tmp_path / "a")
    assert doc["run"]["status"] == "crashed"
    assert doc["step_time"]["steps_total"] == 0  # the script never imported torch

    proc = _run(["--out", str(tmp_path / "b"), str(write_script(tmp_path, "crash.py"))], tmp_path)
    assert proc.returncode == 1
    # The user's traceback, as Python prints it: from the script down, not from our bootstrap.
    assert "RuntimeError: diverged" in proc.stderr
    assert "bootstrap" not in proc.stderr and "runpy" not in proc.stderr, proc.stderr
    doc = _summary(tmp_path / "b")
    assert doc["run"]["status"] == "crashed"
    assert doc["step_time"]["steps_total"] == 20


def test_dash_m_runs_a_module_like_python(tmp_path) -> None:
    write_script(tmp_path, "pkg/__init__.py")
    write_script(tmp_path, "pkg/train.py")
    out = tmp_path / "out"
    proc = _run(["--out", str(out), "-m", "pkg.train", "--out", "x", "-v"], tmp_path)
    assert proc.returncode == 3, proc.stderr  # the module's own exit code (its argument count)
    assert proc.stdout == "module __main__ ['--out', 'x', '-v']\n"  # its arguments, not ours
    assert _summary(out)["run"]["name"] == "train"


def _start(tmp_path: Path, out: Path, name: str, **popen: object) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [*CLI, "run", "--out", str(out), str(write_script(tmp_path, name))],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # no terminal: our signals are the only ones; killpg cleans up
        **popen,  # type: ignore[arg-type]
    )
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        kill_group(proc)
        pytest.fail(line + proc.stderr.read())
    return proc, int(line.split()[1])


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signals_give_interrupted(tmp_path, sig, code) -> None:
    out = tmp_path / "out"
    proc, _ = _start(tmp_path, out, "plain_forever.py", preexec_fn=sigint_default)
    try:
        proc.send_signal(sig)  # to the launcher alone, which passes it on
        assert proc.wait(timeout=60) == code
    finally:
        kill_group(proc)
    assert _summary(out)["run"]["status"] == "interrupted"


def test_sigint_inherited_as_ignored_is_honoured_and_nothing_hangs(tmp_path) -> None:
    """A background job ignores SIGINT; so do the launcher and its child (Python leaves an
    ignored SIGINT ignored), consistently: neither waits on the other. SIGTERM still ends it."""
    out = tmp_path / "out"
    ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    proc, child = _start(tmp_path, out, "plain_forever.py", preexec_fn=ignore)
    try:
        proc.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
        os.kill(child, signal.SIGINT)  # the child ignores it as well
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        kill_group(proc)
    assert _summary(out)["run"]["status"] == "interrupted"


def test_killed_child_still_leaves_a_crashed_summary(tmp_path) -> None:
    out = tmp_path / "out"
    proc, child_pid = _start(tmp_path, out, "plain_forever.py")
    try:
        os.kill(child_pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == 137
        assert "ended without a summary" in proc.stderr.read()
    finally:
        kill_group(proc)
    doc = _summary(out)
    assert doc["run"]["status"] == "crashed"
    assert doc["step_time"]["diagnosis"] == "INSUFFICIENT_DATA"


def test_a_run_killed_mid_training_keeps_its_last_live_snapshot(tmp_path, capsys) -> None:
    """SIGKILL (the OOM killer's way) leaves no summary of the process's own; the launcher's
    used to say "0 steps analysed, run more steps". The last live snapshot (every 0.5 s) holds
    the newest steps' statistics: they become the summary, marked as recovered."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*CLI, "run", "--out", str(out), str(write_script(tmp_path, "workers_forever.py"))],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready"), line + proc.stderr.read()
        child = int(line.split()[1])
        # The bootstrap shows the user's script on its command line (ps, pkill -f train.py).
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        assert b"--" in cmdline and cmdline[-2].endswith(b"workers_forever.py"), cmdline
        snap = out / "live" / "rank0.json"
        deadline = time.monotonic() + 90
        # A snapshot with as many analysed steps as a diagnosis needs: on a slow runner the
        # first ones after warmup hold fewer, and rightly say INSUFFICIENT_DATA.
        while time.monotonic() < deadline:
            if _analysed_in(snap) >= Thresholds().min_steps:
                break
            time.sleep(0.1)
        done_then = json.loads(snap.read_text())["steps_done"]
        os.kill(child, signal.SIGKILL)
        assert proc.wait(timeout=60) == 137
        # The killed child's DataLoader workers hold the launcher's stderr open until their
        # watchdog sees their parent gone (~5 s): the launcher has ended, so end them too
        # before reading what it wrote.
        kill_group(proc)
        err = proc.stderr.read()
    finally:
        kill_group(proc)
    assert "from its last live snapshot" in err, err
    doc = _summary(out)
    assert doc["run"]["status"] == "crashed"
    assert doc["run"]["recovered_from"] == "live_snapshot"
    assert doc["step_time"]["steps_total"] >= done_then > 5
    assert doc["step_time"]["steps_analyzed"] > 0
    assert doc["step_time"]["diagnosis"] != "INSUFFICIENT_DATA"
    assert main(["show", str(out)]) == 0
    shown = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the panel wraps
    assert "from the live snapshot: killed before it wrote its summary" in shown


def test_missing_script_is_a_usage_error(tmp_path, capsys) -> None:
    assert main(["run", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"traceml-ci: error: {tmp_path / 'nope.py'}: no such script"


#: nanoGPT's shape: batches cut from a tensor by get_batch(), no DataLoader to count from.
GET_BATCH = """
import torch
from torch import nn
torch.set_num_threads(1)
data = torch.randn(4096, 8)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def get_batch(i):
    x = data[(i * 12) % 4000:(i * 12) % 4000 + 12]
    return x, x.sum(1, keepdim=True)
for i in range(40):
    x, y = get_batch(i)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


def test_batch_size_gives_samples_per_s_to_a_loop_without_a_dataloader(
        tmp_path, few_steps) -> None:
    """Issue 20: no DataLoader, no samples/s; --batch-size N is samples per step, like
    init(batch_size=N), carried to the child through the launch spec. (Without it: the
    few-step hand-written loop's run, no DataLoader either, with steps analysed.)"""
    bare, bare_out = few_steps
    assert bare.returncode == 0, bare.stderr
    st = _summary(bare_out)["step_time"]
    assert st["steps_analyzed"] > 0 and st["throughput"]["steps_per_s"] > 0
    assert st["throughput"]["samples_per_s"] is None
    assert st["throughput"]["samples_per_step"] is None
    script = tmp_path / "get_batch.py"
    script.write_text(GET_BATCH)
    given = _run(["--out", str(tmp_path / "given"), "--batch-size", "12", str(script)], tmp_path)
    assert given.returncode == 0, given.stderr
    st = _summary(tmp_path / "given")["step_time"]
    assert st["steps_total"] == 40
    tput = st["throughput"]
    assert tput["samples_per_step"] == 12
    assert tput["samples_per_s"] == pytest.approx(12 * tput["steps_per_s"], rel=1e-3)


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "eight", "9\x1b[2J"])
def test_a_bad_batch_size_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, value) -> None:
    script = tmp_path / "get_batch.py"
    script.write_text(GET_BATCH)
    monkeypatch.chdir(tmp_path)
    # main(argv) in this process, as the console script: refused before anything starts
    assert main(["run", "--out", str(tmp_path / "o"), "--batch-size", value, str(script)]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceml-ci: error: --batch-size "), err
    assert lines[0].endswith(": must be a whole number of at least 1"), err
    assert "\x1b" not in out + err
    assert not (tmp_path / "o").exists()  # nothing ran


#: A hand-written SGD update: backward passes, never an optimizer.step().
HAND_SGD = """
import torch
from torch import nn
torch.set_num_threads(1)
model = nn.Linear(8, 1)
for i in range(30):
    x = torch.randn(16, 8)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
"""


def test_backward_without_optimizer_step_says_why_there_are_no_steps(tmp_path, capsys) -> None:
    """Issue 20: zero-change steps end at optimizer.step(); a hand-written update gave 0 steps
    and no word why. The summary's hint, the stderr line and `show` now say it."""
    script = tmp_path / "hand_sgd.py"
    script.write_text(HAND_SGD)
    out = tmp_path / "out"
    proc = _run(["--out", str(out), str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = _summary(out)
    assert doc["run"]["mode"] == "zero-change" and doc["step_time"]["steps_total"] == 0
    diag = doc["diagnoses"][0]
    assert diag["kind"] == "INSUFFICIENT_DATA"
    assert "30 backward passes" in diag["message"] and "optimizer.step()" in diag["message"]
    assert "trace_step" in diag["next_step"]
    assert "no steps: 30 backward passes but no optimizer.step()" in proc.stderr
    capsys.readouterr()
    # `show` in this process (main(argv), as the console script): no second interpreter
    assert main(["show", str(out / "final_summary.json")]) == 0
    shown = capsys.readouterr().out
    assert "optimizer.step()" in shown and "trace_step" in shown


#: HAND_SGD with an optimizer step after each update: 12 steps, fewer analysed (after the default
#: 5 warmup steps) than a diagnosis needs; no DataLoader.
FEW_STEPS = HAND_SGD.replace("range(30)", "range(12)").replace(
    "p -= 0.01 * p.grad",
    "p -= 0.01 * p.grad\n    torch.optim.SGD(model.parameters()).step()",
)


@pytest.fixture(scope="module")
def few_steps(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """FEW_STEPS' ``traceml-ci run``, once: (the finished run, its --out folder)."""
    script = tmp_path_factory.mktemp("few-script") / "few.py"
    script.write_text(FEW_STEPS)
    return _shared_run(tmp_path_factory, "few", [str(script)])


def test_a_run_with_optimizer_steps_gets_no_such_note(few_steps) -> None:
    proc, out = few_steps
    assert proc.returncode == 0, proc.stderr
    doc = _summary(out)
    assert doc["run"]["mode"] == "zero-change" and doc["step_time"]["steps_total"] == 12
    diag = doc["diagnoses"][0]
    assert diag["kind"] == "INSUFFICIENT_DATA" and "backward passes" not in diag["message"]
    assert "optimizer.step()" not in proc.stderr
