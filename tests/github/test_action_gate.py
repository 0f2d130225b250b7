"""``traceml-ci action-gate`` in-process, with the pytest subprocess stood in for by the plugin's
own session code gating real summaries (the real subprocess: test_action_steps.py)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.github.baselines import slowed_baseline
from tests.github.composite import parse_outputs
from tests.github.conftest import PR, REPO
from traceml_ci.cli.main import main

DATA = Path(__file__).parent / "data"
SUMMARIES = DATA / "summaries.json"  # a real set written by the plugin for a tiny CPU loop


class FakePytest:
    """Replaces the pytest subprocess: records its command, then does what the plugin does at
    the end of a session whose traced tests produced SUMMARIES -- with the plugin's own code
    (TracemlState, gate_summaries), so the files are the plugin's, not an imitation."""

    def __init__(self, exit_code: int = 0, writes: bool = True) -> None:
        self.exit_code = exit_code
        self.writes = writes
        self.cmd: list[str] = []

    def __call__(self, cmd: list[str]) -> int:
        from pytest_plugin.gating import gate_summaries
        from pytest_plugin.options import Options, SetupError
        from pytest_plugin.state import TracemlState

        self.cmd = cmd
        if not self.writes:
            return self.exit_code
        given = dict(a.split("=", 1) for a in cmd if a.startswith("--traceml-") and "=" in a)

        def path(flag: str) -> Path | None:
            return Path(given[flag]) if given.get(flag) else None

        state = TracemlState(Options(
            baseline=path("--traceml-baseline"), save=path("--traceml-save"),
            report=path("--traceml-report"), comparison=path("--traceml-comparison"),
            tolerances=path("--traceml-tolerances"), confirm=0,
            report_only="--traceml-report-only" in cmd,
        ))  # fmt: skip
        try:
            state.load()
        except SetupError as exc:  # what pytest prints for the plugin's usage errors
            print(f"ERROR: {exc}", file=sys.stderr)
            return 4
        for key, doc in json.loads(SUMMARIES.read_text())["summaries"].items():
            try:
                gate_summaries(state, nodeid=f"test_smoke.py::{key}", key=key, docs=[doc])
            except pytest.fail.Exception:
                pass  # the test failed; the exit code is the caller's to choose
        state.write_files()
        assert not state.errors, state.errors
        return self.exit_code


@pytest.fixture
def gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., dict[str, Any]]:
    """Run action-gate in a fake job; returns its outputs, summary, stdout and the fake."""
    monkeypatch.chdir(tmp_path)
    for name in ("GITHUB_TOKEN", "RUNNER_TEMP", "GITHUB_EVENT_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "output"))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    monkeypatch.setenv("GITHUB_JOB", "smoke")
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO)

    def run(
        *args: str, event: tuple[str, dict] | None = None, fake: FakePytest | None = None
    ) -> dict[str, Any]:
        fake = fake or FakePytest()
        monkeypatch.setattr("traceml_ci.cli.action_gate.subprocess.call", fake)
        if event:
            (tmp_path / "event.json").write_text(json.dumps(event[1]))
            monkeypatch.setenv("GITHUB_EVENT_NAME", event[0])
            monkeypatch.setenv("GITHUB_EVENT_PATH", str(tmp_path / "event.json"))
        else:
            monkeypatch.setenv("GITHUB_EVENT_NAME", "push")
        (tmp_path / "output").write_text("")
        code = main(["action-gate", "--out", str(tmp_path / "out"), *args])
        out, err = capsys.readouterr()
        outputs = parse_outputs((tmp_path / "output").read_text())
        summary = (tmp_path / "summary.md").read_text() if code == 0 else ""
        return {"code": code, "outputs": outputs, "summary": summary, "stdout": out,
                "stderr": err, "fake": fake}  # fmt: skip

    return run


def write_slow_baseline(tmp_path: Path) -> str:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(slowed_baseline(SUMMARIES)))
    return str(path)


def pr_event(fork: bool = False) -> tuple[str, dict]:
    head = "someone/widgets" if fork else REPO
    return "pull_request", {
        "number": PR,
        "pull_request": {
            "number": PR,
            "head": {"sha": "c" * 40, "repo": {"full_name": head}},
            "base": {"sha": "d" * 40, "repo": {"full_name": REPO}},
        },
    }


def test_same_summaries_pass_and_update_only(gate, tmp_path: Path) -> None:
    shutil.copy(SUMMARIES, tmp_path / "baseline.json")
    r = gate("--baseline", "baseline.json", event=pr_event())
    assert r["code"] == 0
    assert r["outputs"]["verdict"] == "pass"
    assert r["outputs"]["failed"] == "false"
    # on-regression, no regression: only refresh a comment an earlier run may have left
    assert r["outputs"]["comment-mode"] == "update"
    assert "--traceml-baseline=baseline.json" in r["fake"].cmd
    meta = json.loads(Path(r["outputs"]["meta-path"]).read_text())
    assert meta == {"kind": "traceml-ci/comment-meta", "pr": PR, "marker": "smoke",
                    "mode": "update", "head_sha": "c" * 40, "verdict": "pass"}  # fmt: skip
    assert Path(r["outputs"]["comparison-path"]).is_file()
    assert "verdict **pass**" in r["summary"]


def test_a_baseline_entry_that_did_not_run_changes_no_verdict(gate, tmp_path: Path) -> None:
    # A traced test deselected (-k, a path) or skipped: its baseline entry is "not run" in
    # the report, the comparison and the Action's outputs alike -- not "removed", no warning.
    doc = json.loads(SUMMARIES.read_text())
    doc["summaries"]["deselected"] = doc["summaries"]["tiny"]
    (tmp_path / "baseline.json").write_text(json.dumps(doc))
    r = gate("--baseline", "baseline.json")
    report = Path(r["outputs"]["report-path"]).read_text()
    comparison = json.loads(Path(r["outputs"]["comparison-path"]).read_text())
    assert r["outputs"]["verdict"] == comparison["verdict"] == "pass"
    assert report.splitlines()[1].startswith("**✅ traceml-ci pass: 1 compared**")
    assert "1 in the baseline not run in this session (not compared): deselected" in report
    assert comparison["removed"] == [] and "removed" not in report


def test_regression_without_failing_on_it(gate, tmp_path: Path) -> None:
    baseline = write_slow_baseline(tmp_path)
    r = gate("--baseline", baseline, "--fail-on-regression", "false", "--comment", "always")
    assert r["outputs"]["verdict"] == "regression"
    assert r["outputs"]["failed"] == "false"
    assert r["outputs"]["comment-mode"] == "skip"  # a push: no pull request to comment on
    # without fail-on-regression the plugin still compares, but no test fails on it
    assert f"--traceml-baseline={baseline}" in r["fake"].cmd
    assert "--traceml-report-only" in r["fake"].cmd
    report = Path(r["outputs"]["report-path"]).read_text()
    assert report.startswith("<!-- traceml-ci:report -->") and "regress" in report.lower()
    assert "::warning title=traceml-ci::performance regression" in r["stdout"]
    assert "step_ms" in r["summary"] and "<!-- traceml-ci:report" not in r["summary"]


def test_regression_fails_and_comments(gate, tmp_path: Path) -> None:
    baseline = write_slow_baseline(tmp_path)
    r = gate("--baseline", baseline, "--tolerances", "", event=pr_event(),
             fake=FakePytest(exit_code=1))  # fmt: skip
    assert r["outputs"]["verdict"] == "regression"
    assert r["outputs"]["failed"] == "true"
    assert r["outputs"]["reason"].startswith("performance regression")
    assert r["outputs"]["comment-mode"] == "upsert"
    assert "::error title=traceml-ci::performance regression" in r["stdout"]


def test_fork_pull_request_leaves_the_comment_to_workflow_run(gate, tmp_path: Path) -> None:
    baseline = write_slow_baseline(tmp_path)
    r = gate("--baseline", baseline, "--comment-id", "gpu/a100", event=pr_event(fork=True))
    assert r["outputs"]["comment-mode"] == "skip"
    assert "fork" in r["stdout"] and "::notice" in r["stdout"]
    meta = json.loads(Path(r["outputs"]["meta-path"]).read_text())
    assert (meta["pr"], meta["mode"], meta["marker"]) == (PR, "upsert", "gpu/a100")
    assert r["outputs"]["artifact-name"] == "traceml-ci-gpu-a100"


def test_first_run_without_baseline(gate) -> None:
    r = gate("--baseline", "perf/missing.json", "--comment", "always", event=pr_event())
    assert r["outputs"]["verdict"] == "no-baseline"
    assert r["outputs"]["failed"] == "false"
    assert r["outputs"]["comment-mode"] == "upsert"
    assert "--traceml-update-baseline" in Path(r["outputs"]["report-path"]).read_text()


@pytest.mark.parametrize(
    ("fake", "verdict", "reason"),
    [
        (FakePytest(exit_code=4, writes=False), "error", "pytest failed (exit 4)"),
        (FakePytest(exit_code=5, writes=False), "error", "pytest collected no tests"),
        (FakePytest(exit_code=1), "pass", "pytest failed (exit 1)"),
    ],
)
def test_failed_pytest_fails_the_job(gate, tmp_path: Path, fake, verdict, reason) -> None:
    shutil.copy(SUMMARIES, tmp_path / "baseline.json")
    r = gate("--baseline", "baseline.json", fake=fake)
    assert r["code"] == 0
    assert (r["outputs"]["verdict"], r["outputs"]["failed"]) == (verdict, "true")
    assert r["outputs"]["reason"].startswith(reason)
    assert Path(r["outputs"]["report-path"]).read_text().startswith("<!-- traceml-ci:report -->")


def test_unreadable_baseline_is_an_error_verdict(gate, tmp_path: Path) -> None:
    (tmp_path / "baseline.json").write_text("{not json")
    r = gate("--baseline", "baseline.json", "--fail-on-regression", "false")
    assert (r["outputs"]["verdict"], r["outputs"]["failed"]) == ("error", "true")
    assert "baseline.json" in r["stderr"]  # the plugin's one-line error names the file


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--pytest-args", "tests -k 'unclosed"], "--pytest-args"),
        (["--tolerances", "nope.toml"], "no such file"),
    ],
)
def test_bad_arguments_are_exit_2(gate, args, problem) -> None:
    r = gate(*args)
    assert r["code"] == 2 and problem in r["stderr"] and r["stderr"].count("\n") == 1
    assert r["fake"].cmd == []  # pytest never started


def test_fail_on_regression_must_be_a_boolean(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["action-gate", "--fail-on-regression", "maybe"])
    assert exc.value.code == 2 and "expected true or false" in capsys.readouterr().err


def test_profile_on_regression_asks_the_plugin_for_profiles_in_the_artifact(
    gate, tmp_path: Path
) -> None:
    baseline = write_slow_baseline(tmp_path)
    stale = tmp_path / "out" / "profiles" / "old" / "profile" / "trace.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    r = gate("--baseline", baseline, "--profile-on-regression", "true")
    cmd = r["fake"].cmd
    assert "--traceml-profile-on-regression" in cmd
    assert f"--traceml-profile-dir={tmp_path / 'out' / 'profiles'}" in cmd
    assert r["outputs"]["artifact-dir"] == str(tmp_path / "out")  # the profiles are inside it
    assert not stale.exists()  # an earlier run's trace never passes for this one's
    off = gate("--baseline", baseline)
    assert not any(a.startswith("--traceml-profile") for a in off["fake"].cmd)


class FakeAbPytest(FakePytest):
    """Replaces the pytest subprocess of an A/B job: what the plugin writes at the end of a
    ``--traceml-ab`` session whose one traced test had these rounds (head/base step-time
    ratios), with the plugin's own code (TracemlState, AbSession, AbOutcome) and the A/B
    pipeline's decision (``gate.ab.decide``)."""

    def __init__(self, ratios: list[float], exit_code: int = 0) -> None:
        super().__init__(exit_code)
        self.ratios = ratios

    def __call__(self, cmd: list[str]) -> int:
        from pytest_plugin.ab import AbOutcome
        from pytest_plugin.options import Options
        from pytest_plugin.state import TracemlState
        from traceml_ci.gate.ab.sequential import RoundPair, SideFigures, decide

        self.cmd = cmd
        given = dict(a.split("=", 1) for a in cmd if a.startswith("--traceml-") and "=" in a)
        state = TracemlState(Options(
            ab=given["--traceml-ab"], ab_rounds_max=len(self.ratios),
            save=Path(given["--traceml-save"]), report=Path(given["--traceml-report"]),
            comparison=Path(given["--traceml-comparison"]),
            ab_json=Path(given["--traceml-ab-json"]),
            report_only="--traceml-report-only" in cmd,
        ))  # fmt: skip
        state.start_ab(Path.cwd())
        head = json.loads(SUMMARIES.read_text())["summaries"]["tiny"]
        shares = {"forward": 40.0, "backward": 40.0}
        rounds = [RoundPair(n, SideFigures(10.0, shares), SideFigures(10.0 * r, shares))
                  for n, r in enumerate(self.ratios, 1)]  # fmt: skip
        assert state.ab is not None
        result = decide(rounds, state.ab.settings)
        assert result.verdict is not None
        state.record_ab(AbOutcome("test_smoke.py::test_tiny", "tiny", result.verdict.value,
                                  result.reason(), result), head)  # fmt: skip
        state.write_files()
        assert not state.errors, state.errors
        return self.exit_code


def _git_repo(path: Path) -> None:
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c",
                        "user.email=t@example.com", *args], check=True, capture_output=True)

    git("init", "-q")
    (path / "README").write_text("x\n")
    git("add", "README")
    git("commit", "-qm", "base")


@pytest.mark.parametrize(
    ("ratios", "exit_code", "verdict", "failed", "mode"),
    [
        ([2.0, 2.1, 2.05], 1, "regression", "true", "upsert"),  # a regression takes 3 rounds
        ([1.0, 1.0], 0, "pass", "false", "update"),
        ([0.7, 1.4], 1, "inconclusive", "true", "upsert"),  # --traceml-ab-inconclusive=fail
        ([0.7, 1.4], 0, "inconclusive", "false", "upsert"),  # the default: it passes
    ],
)  # fmt: skip
def test_ab_base_reaches_pytest_and_its_verdict_is_the_steps(
    gate, tmp_path: Path, ratios, exit_code, verdict, failed, mode
) -> None:
    _git_repo(tmp_path)
    r = gate("--ab-base", "HEAD", event=pr_event(), fake=FakeAbPytest(ratios, exit_code))
    cmd = r["fake"].cmd
    assert "--traceml-ab=HEAD" in cmd and "--traceml-ab-inconclusive=pass" in cmd
    assert f"--traceml-ab-json={tmp_path / 'out' / 'ab.json'}" in cmd
    assert not any(a.startswith(("--traceml-baseline", "--traceml-report-only")) for a in cmd)
    out = r["outputs"]
    assert (out["verdict"], out["failed"], out["comment-mode"]) == (verdict, failed, mode)
    assert json.loads(Path(out["artifact-dir"], "ab.json").read_text())["verdict"] == verdict
    report = Path(out["report-path"]).read_text()
    assert report.startswith("<!-- traceml-ci:report -->\n## traceml-ci A/B against `HEAD = ")
    assert f"**{verdict.upper()}**" in report and "traceml-ci A/B" in r["summary"]
    if verdict == "inconclusive" and exit_code:
        assert "the A/B verdict is inconclusive" in out["reason"]
        assert "::warning title=traceml-ci::A/B inconclusive" in r["stdout"]
    elif verdict == "inconclusive":  # no evidence of a regression: a notice, the job passes
        assert out["reason"] == ""
        assert "::notice title=traceml-ci::A/B inconclusive" in r["stdout"]


def test_ab_base_without_failing_on_regression_reports_only(gate, tmp_path: Path) -> None:
    _git_repo(tmp_path)
    r = gate("--ab-base", "HEAD", "--fail-on-regression", "false",
             fake=FakeAbPytest([2.0, 2.1, 2.05]))
    assert "--traceml-report-only" in r["fake"].cmd
    assert (r["outputs"]["verdict"], r["outputs"]["failed"]) == ("regression", "false")


def test_ab_base_and_baseline_together_are_exit_2(gate) -> None:
    r = gate("--ab-base", "main", "--baseline", "b.json")
    assert r["code"] == 2 and r["stderr"].count("\n") == 1
    assert "--ab-base and --baseline: give one" in r["stderr"]
    assert r["fake"].cmd == []  # pytest never started
