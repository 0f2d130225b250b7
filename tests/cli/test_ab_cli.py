"""`traceml-ci ab` for real: a git repository with two commits made here, the base checked out
as a temporary worktree, both sides traced in interleaved rounds, the verdict as exit code; and
the command lines it refuses in one line, exit 2."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.abrepo import SPIN_NET, commit, git, only_the_repository, spinning, worktrees
from tests.cli.scripts import kill_group, run_group, run_together
from tests.pytest_plugin.shared import once_per_session
from traceml_ci.cli.ab import parse_command
from traceml_ci.cli.main import main
from traceml_ci.errors import UsageError
from traceml_ci.gate.ab.sequential import DEFAULT_MAX_ROUNDS, HOST_CONFIRM_ROUNDS
from traceml_ci.gate.judging import HOST_BAND_CPU_PCT
from traceml_ci.gitwork import side_env

CLI = [sys.executable, "-m", "traceml_ci"]

#: A tiny training loop whose forward spins (SPIN_NET: not at all in the base, 5 ms in the
#: head commit where a test wants a slowdown); untraced: ``ab`` traces it with no change.
TRAIN = SPIN_NET + """

model = Net(128)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 128)
for _ in range(30):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
"""
SPIN_MS = 5.0


def _repo(tmp_path: Path, head_spin_ms: float | None) -> Path:
    """Two commits: the base's train.py, then the head's (spinning ``head_spin_ms`` in
    forward; None: the head only adds a README)."""
    repo = tmp_path / "repo"
    commit(repo, "base", {"train.py": TRAIN})
    if head_spin_ms is None:
        commit(repo, "head", {"README": "no change to the training\n"})
    else:
        commit(repo, "head", {"train.py": spinning(TRAIN, head_spin_ms)})
    return repo


def _ab(repo: Path, out: Path, *extra: str, timeout: float = 300):
    return run_group([*CLI, "ab", "--base", "HEAD~1", "--out", str(out), "--format", "json",
                      *extra, "--", "python", "train.py"], repo, timeout)  # fmt: skip


def test_a_5ms_spin_in_forward_is_a_regression_naming_forward_and_step_time(tmp_path) -> None:
    repo = _repo(tmp_path, SPIN_MS)
    out = tmp_path / "ab"
    done = _ab(repo, out)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "regression"
    # A host clock: the timings fail only past their band (here ~50x the CPU time per step,
    # +80 pp of the forward share) and in every round; the reason names each row that did.
    assert doc["clock"] == "host"
    assert doc["reason"].startswith("regression after 3 rounds, in every round: ")
    assert "step_time.cpu_ms" in doc["confirmed"]
    for name in doc["confirmed"]:
        assert f"{name}: " in doc["reason"]
    # the intervals are estimates against the bands: both sides measured their CPU per step
    # (three rounds' intervals are wide: their estimates, not their bounds, are what is sure)
    intervals = {iv["metric"]: iv for iv in doc["intervals"]}
    assert intervals["step_cpu"]["estimate"] > HOST_BAND_CPU_PCT and "step_time" in intervals
    assert doc["base"]["commit"] == git(repo, "rev-parse", "HEAD~1").strip()
    rounds = doc["rounds"]
    assert len(rounds) == HOST_CONFIRM_ROUNDS  # confirmed in every round
    assert [r["first"] for r in rounds] == (["base", "head"] * DEFAULT_MAX_ROUNDS)[: len(rounds)]
    # the truth, known here: the head adds one 5 ms spin per step (forward runs once); the
    # median round, as one round whose busy neighbours fell on one side's run moves its own
    added_ms = statistics.median(r["head"]["step_ms"] - r["base"]["step_ms"] for r in rounds)
    assert 0.8 * SPIN_MS < added_ms < 4 * SPIN_MS, rounds
    for r in rounds:
        for side in ("base", "head"):
            assert (out / side / f"round{r['round']}.json").is_file()
            assert (out / side / f"round{r['round']}.log").is_file()
    assert json.loads((out / "ab.json").read_text())["verdict"] == "regression"
    assert "REGRESSION" in (out / "report.md").read_text()
    assert only_the_repository(repo), worktrees(repo)  # the base's worktree is gone


#: A loop that calls trace_step itself (the counters are counted on its steps); the head commit
#: reads the loss as a Python float each step.
TRACED = """\
import torch
import traceml_ci as traceml

torch.set_num_threads(1)
model = torch.nn.Linear(128, 128)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 128)
for _ in range(30):
    with traceml.trace_step(model):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        pass  # READ
"""


def _two_rounds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    same = _repo(tmp_path_factory.mktemp("same"), None)
    read = tmp_path_factory.mktemp("read") / "repo"
    commit(read, "base", {"train.py": TRACED})
    commit(read, "head", {"train.py": TRACED.replace("pass  # READ", "loss.item()")})
    repos = {"same": same, "read": read}
    done = run_together({name: (lambda r=repo: _ab(r, r.parent / "ab", "--rounds-max", "2"))
                         for name, repo in repos.items()})
    return {name: {"repo": str(repo), "returncode": done[name].returncode,
                   "stdout": done[name].stdout, "stderr": done[name].stderr}
            for name, repo in repos.items()}


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory: pytest.TempPathFactory):
    """The A/Bs no timing can make a regression (on a host clock the first round's counts
    decide): the same code twice, and a scalar read added (its counter decides). Independent,
    so they run together, once per test session (whichever xdist worker asks first): name ->
    (repository, --out folder, the finished ``traceml-ci ab``)."""
    data = once_per_session(tmp_path_factory, "test_ab_cli_two_rounds",
                            lambda: _two_rounds(tmp_path_factory))
    found = {}
    for name, d in data.items():
        repo = Path(d["repo"])
        done = subprocess.CompletedProcess([], d["returncode"], d["stdout"], d["stderr"])
        found[name] = (repo, repo.parent / "ab", done)
    return found


def test_no_change_between_the_commits_is_never_a_regression(two_rounds) -> None:
    repo, _, done = two_rounds["same"]
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["verdict"], doc["clock"], len(doc["rounds"])) == ("pass", "host", 1)
    assert doc["reason"].startswith("pass after 1 round: ")
    assert "timings (host clock) inform: step " in doc["reason"]
    assert only_the_repository(repo), worktrees(repo)


def test_a_scalar_read_added_per_step_fails_the_ab_and_heads_its_report(two_rounds) -> None:
    repo, out, done = two_rounds["read"]
    line = TRACED.splitlines().index("        pass  # READ") + 1
    said = f"adds 1 scalar read per step at train.py:{line} (item)"
    # the timings alone may say anything; the counter decides
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "regression" and doc["causes"] == [said]
    assert said in doc["reason"]
    syncs = {r["name"]: r for r in doc["counters"]}["counters.syncs_per_step"]
    assert (syncs["base"], syncs["head"], syncs["status"]) == (0, 1, "regressed")
    assert (out / "report.md").read_text().splitlines()[4] == f"**Cause:** {said}"
    assert only_the_repository(repo), worktrees(repo)


def test_inconclusive_exits_0_unless_asked_to_fail() -> None:
    from traceml_ci.cli.diff import exit_code
    from traceml_ci.gate.results import Verdict

    assert exit_code(Verdict.INCONCLUSIVE) == 0
    assert exit_code(Verdict.INCONCLUSIVE, "fail") == 7
    assert exit_code(Verdict.REGRESSION, "pass") == 1
    assert exit_code(Verdict.PASS, "fail") == 0


def test_a_failing_base_setup_is_exit_3_and_leaves_no_worktree(tmp_path) -> None:
    repo = _repo(tmp_path, SPIN_MS)
    out = tmp_path / "ab"
    done = _ab(repo, out, "--base-setup", "echo building; test -f train.py && exit 9",
               timeout=60)  # fmt: skip
    assert done.returncode == 3, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("traceml-ci: error: --base-setup exited 9 in the base worktree")
    assert (out / "base" / "setup.log").read_text() == "building\n"  # ran in the base's tree
    assert not list((out / "base").glob("round*"))  # no round ran
    assert only_the_repository(repo), worktrees(repo)


def _running(pid: int, word: str) -> bool:
    """Whether a process under ``pid`` has ``word`` on its command line."""
    import psutil

    try:
        found = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return False
    for child in found:
        try:
            if any(word in arg for arg in child.cmdline()):
                return True
        except psutil.Error:  # ended meanwhile
            continue
    return False


#: A side that runs until it is stopped, and needs no torch (it starts in a fraction of a
#: second): what is tested is ``ab``'s unwinding, not what the side runs.
FOREVER = "import time\nwhile True:\n    time.sleep(0.05)\n"


def test_sigterm_mid_round_ends_with_130_and_removes_the_worktree(tmp_path) -> None:
    repo = tmp_path / "repo"
    commit(repo, "base", {"train.py": FOREVER})
    commit(repo, "head", {"README": "no change to the training\n"})
    cmd = [*CLI, "ab", "--base", "HEAD~1", "--out", str(tmp_path / "ab"), "--", "python",
           "train.py"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        # The base is checked out and round 1's first side is running (an event, not a fixed
        # wait: its training process has started).
        while len(worktrees(repo)) < 2 or not _running(proc.pid, "train.py"):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)  # the ab process alone, as a CI runner's cancel
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert only_the_repository(repo), worktrees(repo)
    finally:
        kill_group(proc)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--base", "HEAD~1", "python", "train.py"], "put -- before the command"),
        (["--base", "HEAD~1"], "give the command after --"),
        (["--base", "HEAD~1", "--", "python"], "names no script"),
        (["--base", "HEAD~1", "--", "python", "-u", "train.py"], "-u: interpreter options"),
        (["--base", "HEAD~1", "--", "python", "nope.py"], "nope.py: no such script"),
        (["--base", "no-such-ref", "--", "python", "train.py"], "--base 'no-such-ref': no such"),
        (["--base", "HEAD~1", "--rounds-max", "1", "--", "python", "train.py"], "--rounds-max"),
        (["--base", "HEAD~1", "--step-tolerance", "nan", "--", "python", "train.py"],
         "--step-tolerance 'nan'"),
    ],
)  # fmt: skip
def test_unusable_command_lines_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv,
                                                        says) -> None:  # fmt: skip
    repo = _repo(tmp_path, SPIN_MS)
    monkeypatch.chdir(repo)
    assert main(["ab", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1], err
    assert only_the_repository(repo), worktrees(repo)


def test_outside_a_git_repository_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert main(["ab", "--base", "main", "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"traceml-ci: error: {tmp_path}: not inside a git repository "
                   "(ab checks the base out from it)"]  # fmt: skip


def test_the_command_and_the_sides_environment() -> None:
    assert parse_command(["--", "python3.11", "t.py", "--lr", "1"]).args == ("--lr", "1")
    mod = parse_command(["--", "/usr/bin/python", "-m", "pkg.train", "-x"])
    assert (mod.target, mod.args, mod.module) == ("pkg.train", ("-x",), True)
    assert parse_command(["--", "t.py"]).target == "t.py"
    with pytest.raises(UsageError, match="-m takes a MODULE"):
        parse_command(["--", "python", "-m"])
    env = side_env(Path("/w/base"), {"PYTHONPATH": "/site"})
    assert env["PYTHONPATH"] == os.pathsep.join(["/w/base", "/site"])
