"""``pytest --traceml-ab=REF``: real pytest sessions in a real git repository with two commits
made here; every traced test runs base and head as child pytest sessions, interleaved, and is
judged by the same pipeline as ``traceml-ci ab``; the base's worktree is gone afterwards."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.abrepo import SPIN_NET, commit, git, only_the_repository, spinning, worktrees
from tests.cli.scripts import kill_group, run_group, run_together
from tests.pytest_plugin.shared import once_per_session, result_data, result_from
from traceml_ci.gate.ab.sequential import HOST_CONFIRM_ROUNDS
from traceml_ci.gate.judging import HOST_BAND_CPU_PCT

#: A tiny training loop whose forward spins (SPIN_NET) 1 ms; the head commit spins longer where
#: a test wants a slowdown.
TRAIN = "import traceml_ci\n" + SPIN_NET + """

def train(steps=25):
    torch.manual_seed(0)
    model = Net(32)
    x = torch.randn(8, 32)
    for _ in range(steps):
        with traceml_ci.trace_step(model):
            model.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            with torch.no_grad():  # no torch.optim: its first use costs a fresh process seconds
                for p in model.parameters():
                    p -= 0.01 * p.grad
"""
BASE_SPIN_MS = 1.0

#: No warmup: the tracer counts FLOPs on a warmup step, and torch's FLOP counter imports
#: torch._dynamo, seconds per child process on a loaded machine; a median of 25 steps does not
#: mind the first step's lazy set-up. The training module (torch) is imported by the test that
#: runs it, not at collection: the A/B session runs its traced tests in child sessions only,
#: and would import torch for nothing (seconds, in each of these sessions).
TESTS = """\
import pytest


def train(**kwargs):
    from abtrain import train

    train(**kwargs)


@pytest.mark.traceml(warmup_steps=0)
def test_train():
    train()


def test_untraced():
    assert True
"""

NEW_TEST = """

@pytest.mark.traceml(warmup_steps=0, key="fresh")
def test_new():
    train()
"""

#: A second traced test, in the base too where a session batches the first round.
SECOND_TEST = """

@pytest.mark.traceml(warmup_steps=0, key="second")
def test_second():
    train(steps=20)
"""

#: What the head's forward adds to the base's 1 ms spin: a step several times slower, which
#: two or three rounds tell apart even on a loaded machine: its CPU per step well past the host
#: clock's 4x band.
ADDED_MS = 30.0

#: Where the outer session's temporary folders (and so the base's worktree) go, per test.
TMP = "tmp-of-session"


class Project:
    """The repository: a base commit, then a head commit made from ``head_train``/``head_tests``
    (None: unchanged); pytest runs in a subprocess (its own process group, killed however the
    run ends) with its own TMPDIR. Neither that session nor its A/B children load hypothesis's
    plugin, seconds per child on a loaded machine (PYTEST_ADDOPTS reaches both)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path / TMP
        self.tmp.mkdir(exist_ok=True)  # (a shared project is opened again: once_per_session)
        # (nor xdist's and anyio's plugins: a tenth of a second of start-up per session)
        self.env = {**os.environ, "TMPDIR": str(self.tmp), "PY_COLORS": "0",
                    "PYTEST_ADDOPTS": "-p no:hypothesispytest -p no:cacheprovider -p no:xdist "
                                      "-p no:anyio",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(path),
                                                                os.environ.get("PYTHONPATH")]))}

    def commits(self, head_train: str | None = None, head_tests: str | None = None,
                base_tests: str = TESTS) -> None:
        commit(self.path, "base", {".gitignore": f"{TMP}/\n__pycache__/\n",
                                   "abtrain.py": spinning(TRAIN, BASE_SPIN_MS),
                                   "test_ab_smoke.py": base_tests})
        head = {"README": "the head\n"}
        if head_train is not None:
            head["abtrain.py"] = head_train
        if head_tests is not None:
            head["test_ab_smoke.py"] = head_tests
        commit(self.path, "head", head)

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "pytest", *args]

    def run(self, *args: str, timeout: float = 170) -> pytest.RunResult:
        start = time.monotonic()
        done = run_group(self.command(*args), self.path, timeout, env=self.env)
        return pytest.RunResult(done.returncode, done.stdout.splitlines(),
                                done.stderr.splitlines(), time.monotonic() - start)

    def assert_clean(self) -> None:
        """The base's worktree is gone: git lists only the repository, the temp folder holds
        no traceml-ab-* folder."""
        assert only_the_repository(self.path), worktrees(self.path)
        assert not list(self.tmp.glob("traceml-ab-*"))


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path / "project")


def test_a_head_much_slower_fails_naming_the_regression(project: Project) -> None:
    project.commits(head_train=spinning(TRAIN, BASE_SPIN_MS + ADDED_MS))
    ab_json = project.path / "ab.json"
    report = project.path / "report.md"
    # On a host clock a timing fails only past its band (here ~6x the step time) and in every
    # round: three rounds (six child sessions, 10-25 s each when loaded)
    result = project.run("--traceml-ab=HEAD~1", "--traceml-ab-rounds-max=4",
                         f"--traceml-ab-json={ab_json}", f"--traceml-report={report}",
                         timeout=480)
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    # the failure: the verdict, the rounds table, each regressed metric with its interval
    result.stdout.fnmatch_lines([
        "*traceml: A/B regression for test_ab_smoke.py::test_train against HEAD~1 = *",
        "Timings (host clock: they inform, *): step *; past the band: *step_time.cpu_ms*",
        "round  first  base ms  head ms  head/base  *",
        "REGRESSION: regression after 3 rounds, in every round: *step_time.cpu_ms*",
        "A/B REGRESSION *test_ab_smoke.py::test_train  regression after*",
        "traceml: A/B verdict: regression (1 of 1 regression: test_ab_smoke.py::test_train)",
    ])
    assert "Traceback" not in out
    doc = json.loads(ab_json.read_text())
    assert doc["verdict"] == "regression"
    assert doc["base"]["commit"] == git(project.path, "rev-parse", "HEAD~1").strip()
    [test] = doc["tests"]
    assert test["nodeid"] == "test_ab_smoke.py::test_train" and test["verdict"] == "regression"
    rounds = test["ab"]["rounds"]
    assert len(rounds) == 3  # confirmed in every round (gate.ab.HOST_CONFIRM_ROUNDS)
    assert test["ab"]["clock"] == "host"
    assert "step_time.cpu_ms" in test["ab"]["confirmed"]
    assert [r["first"] for r in rounds] == (["base", "head"] * 3)[: len(rounds)]
    # the truth, known here: the head spins ADDED_MS more per step (one forward a step); the
    # median round, as one round whose busy neighbours fell on one side's run moves its own
    added_ms = statistics.median(r["head"]["step_ms"] - r["base"]["step_ms"] for r in rounds)
    assert 0.8 * ADDED_MS < added_ms < 4 * ADDED_MS, rounds
    # the intervals are estimates, shown against the host clock's bands: 4x the CPU time per
    # step is what fails (the wall clock's, stretched or shrunk by load, only informs)
    cpu = next(iv for iv in test["ab"]["intervals"] if iv["metric"] == "step_cpu")
    assert cpu["tolerance"] == HOST_BAND_CPU_PCT and cpu["estimate"] > HOST_BAND_CPU_PCT, cpu
    md = report.read_text()
    assert md.startswith("<!-- traceml-ci:report -->\n## traceml-ci A/B against `HEAD~1")
    assert "**REGRESSION**" in md and "#### test_ab_smoke.py::test_train" in md
    project.assert_clean()


#: The sessions no timing can turn into a regression (a host clock's timings inform; or nothing
#: to compare): name -> (head commit's changes, pytest's arguments).
QUIET = {
    # Same code on both sides, two traced tests: the first round's counts decide, whatever the
    # timings (even with tolerances no timing could ever clear: on a host clock they only
    # inform); that round batched, one child session per side. (One session for both points:
    # each A/B session costs child sessions that import torch.)
    "no change": ({"base_tests": TESTS + SECOND_TEST},
                  ["--traceml-ab=HEAD~1", "--traceml-ab-step-tolerance=0",
                   "--traceml-ab-share-tolerance=0", "--traceml-ab-json=ab.json", "-W", "default"]),
    "no base": ({"head_tests": TESTS + NEW_TEST},
                ["--traceml-ab=HEAD~1", "-k", "test_new", "--traceml-save=head.json"]),
    # The head adds a test the base lacks: the base's batch finds no such node id, so each
    # test runs its own first round (the new one runs here, as without A/B).
    "batch falls back": ({"head_tests": TESTS + NEW_TEST}, ["--traceml-ab=HEAD~1",
                                                            "--traceml-ab-json=ab.json"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Project, pytest.RunResult]]:
    """The QUIET sessions, each in its own project: independent, so they run together; once
    per test session (shared.py), whichever worker runs the tests."""

    def produce() -> dict[str, Any]:
        projects = {name: Project(tmp_path_factory.mktemp("ab") / "project") for name in QUIET}
        for name, (head, _) in QUIET.items():
            projects[name].commits(**head)
        results = run_together({name: (lambda n=name: projects[n].run(*QUIET[n][1]))
                                for name in QUIET})
        return {name: {"path": str(projects[name].path), "result": result_data(results[name])}
                for name in QUIET}

    done = once_per_session(tmp_path_factory, "ab-quiet", produce)
    return {name: (Project(Path(d["path"])), result_from(d["result"])) for name, d in done.items()}


def test_no_change_is_never_a_regression(quiet) -> None:
    project, result = quiet["no change"]
    doc = json.loads((project.path / "ab.json").read_text())
    assert {t["nodeid"] for t in doc["tests"]} == {"test_ab_smoke.py::test_train",
                                                   "test_ab_smoke.py::test_second"}
    for test in doc["tests"]:
        assert test["verdict"] == "pass", test["detail"]
        # the first round's counts decide; a timing past its host-clock band in round 1 (a
        # loaded runner can do that to a 2 ms step) is re-run to confirm, never failed alone
        rounds = len(test["ab"]["rounds"])
        assert 1 <= rounds <= HOST_CONFIRM_ROUNDS, test["detail"]
        if rounds == 1:
            assert test["detail"].startswith("pass after 1 round: ")
        else:
            assert "regressed in round 1, not in every round since: not confirmed" in (
                test["detail"])
        assert "timings (host clock) inform: step " in test["detail"]
    assert doc["verdict"] == "pass"
    result.assert_outcomes(passed=3)  # and no warning
    assert result.ret == 0
    out = result.stdout.str()
    assert "A/B REGRESSION" not in out and "regression for" not in out
    assert "warnings summary" not in out and "PytestWarning" not in out
    project.assert_clean()


def _first_rounds(project: Project) -> list[str]:
    """The child answers of first rounds, as folder/file under the session's temp folder."""
    return sorted(f"{p.parent.name.rstrip('0123456789')}/{p.name}"
                  for p in project.tmp.rglob("*-round1.json"))


def test_every_tests_first_round_runs_in_one_child_per_side(quiet) -> None:
    project, result = quiet["no change"]  # two traced tests, the same on both sides
    result.assert_outcomes(passed=3)
    doc = json.loads((project.path / "ab.json").read_text())
    assert doc["verdict"] == "pass"
    assert {t["nodeid"]: t["verdict"] for t in doc["tests"]} == {
        "test_ab_smoke.py::test_train": "pass", "test_ab_smoke.py::test_second": "pass"}
    # a timing past its band in round 1 on a loaded runner may take confirmation rounds
    assert all(1 <= len(t["ab"]["rounds"]) <= HOST_CONFIRM_ROUNDS for t in doc["tests"]), doc
    # two child sessions in all for the first round, each running both tests, none per test
    assert _first_rounds(project) == ["traceml-ab-first-round/base-round1.json",
                                      "traceml-ab-first-round/head-round1.json"]
    for side in ("base", "head"):
        # (rglob's ** does not follow pytest's "...current" links to its numbered folders)
        [answer] = [p for p in project.tmp.rglob(f"{side}-round1.json")
                    if p.parent.name.startswith("traceml-ab-first-round")]
        nodes = json.loads(answer.read_text())["nodes"]
        assert nodes == {"test_ab_smoke.py::test_train": {"passed": True, "keys": [
                             "test_ab_smoke.py::test_train"]},
                         "test_ab_smoke.py::test_second": {"passed": True, "keys": ["second"]}}
    project.assert_clean()


def test_a_batch_the_base_cannot_answer_falls_back_to_each_tests_own_round(quiet) -> None:
    project, result = quiet["batch falls back"]
    result.assert_outcomes(passed=3)
    doc = json.loads((project.path / "ab.json").read_text())
    verdicts = {t["nodeid"]: t["verdict"] for t in doc["tests"]}
    assert verdicts == {"test_ab_smoke.py::test_train": "pass",
                        "test_ab_smoke.py::test_new": "no base"}
    # the base's batch child ran and was dropped (no test_new there: pytest's "not found"), so
    # the head's never ran; test_train ran its own first round, test_new its own base's
    assert _first_rounds(project) == ["traceml-ab-first-round/base-round1.json",
                                      "traceml-test_new/base-round1.json",
                                      "traceml-test_train/base-round1.json",
                                      "traceml-test_train/head-round1.json"]
    project.assert_clean()


def test_a_test_the_base_lacks_runs_here_and_passes_with_a_note(quiet) -> None:
    project, result = quiet["no base"]
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines([
        "A/B NO BASE *test_ab_smoke.py::test_new [[]key fresh[]]  no base: new test (not in *)",
        "RECORDED *test_ab_smoke.py::test_new [[]key fresh[]]  *step *",
    ])
    # it ran here, traced as without A/B: its summary is saved under its key
    save = project.path / "head.json"
    assert list(json.loads(save.read_text())["summaries"]) == ["fresh"]
    assert "A/B verdict" not in result.stdout.str()  # nothing was compared
    project.assert_clean()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--traceml-ab=no-such-ref"],
         "ERROR: traceml: --traceml-ab 'no-such-ref': no such commit, branch or tag in *"),
        (["--traceml-ab=HEAD~1", "--traceml-baseline=b.json"],
         "ERROR: --traceml-ab and --traceml-baseline: give one *"),
        (["--traceml-ab-rounds-max=3"], "ERROR: --traceml-ab-rounds-max needs --traceml-ab=REF"),
        (["--traceml-ab=HEAD~1", "--traceml-ab-rounds-max=1"],
         "ERROR: traceml: --traceml-ab-rounds-max: rounds: need 2 <= minimum (2) <= maximum (1)"),
        (["--traceml-ab=HEAD~1", "--traceml-ab-inconclusive=maybe"],
         "ERROR: --traceml-ab-inconclusive must be one of pass, warn, fail, not 'maybe'"),
    ],
)  # fmt: skip
def test_unusable_ab_options_stop_the_session_in_one_line(project: Project, args, says) -> None:
    project.commits()
    result = project.run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = [line for line in result.stderr.str().splitlines() if line.strip()]
    assert len(err) == 1, err
    result.stderr.fnmatch_lines([says])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    project.assert_clean()


def test_sigterm_mid_round_ends_the_session_and_removes_the_worktree(project: Project) -> None:
    project.commits()
    cmd = project.command("--traceml-ab=HEAD~1", "--traceml-ab-rounds-max=6")
    proc = subprocess.Popen(cmd, cwd=project.path, stdout=subprocess.PIPE, env=project.env,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(worktrees(project.path)) < 2:  # the base is checked out: round 1 starts
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGTERM)  # the session alone, as a CI runner's cancel
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, out + err
        assert "KeyboardInterrupt" in out
        project.assert_clean()
    finally:
        kill_group(proc)
