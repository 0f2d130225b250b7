"""github-action/action.yml's steps, run as a script in a simulated GitHub Actions job.

A real tiny CPU smoke test goes through pytest and the traceml-ci plugin; GitHub is the fake
server on 127.0.0.1. Two runs of one pull request's job: no baseline yet (passes, comments),
then against a baseline the head is ten times slower than (fails, edits the same comment).
The gate step's other branches are in test_action_gate.py, without pytest subprocesses.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.github.baselines import slowed_baseline
from tests.github.composite import JobResult, clean_environ, run_composite
from tests.github.conftest import PR, REPO, TOKEN
from tests.github.fake_github import FakeGitHub
from traceml_ci.github.sticky import marker_for

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "github-action" / "action.yml"

SMOKE_TEST = """
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import traceml_ci


@pytest.mark.traceml(warmup_steps=3, key="tiny")
def test_tiny_training():
    assert "GITHUB_TOKEN" not in os.environ  # pytest runs the PR's code: it never gets the token
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(1280, 16), torch.randn(1280, 1))
    for x, y in DataLoader(data, batch_size=32):
        with traceml_ci.trace_step(model):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()


@pytest.mark.traceml(key="deselected")
def test_deselected():
    pass  # never runs: the job's pytest-args deselect it (-k)
"""

FAKE_PYTHON = """#!/bin/bash
# The interpreter the Action is given: pip installs are logged, not run; the rest is real.
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$*" >> "$PIP_LOG"; exit 0; fi
exec "{python}" "$@"
"""


class Job:
    """One GitHub Actions job of the workflow, re-runnable with other inputs and events."""

    def __init__(self, root: Path, github: FakeGitHub) -> None:
        self.root = root
        self.github = github
        self.workspace = root / "workspace"
        (self.workspace / "smoke").mkdir(parents=True)
        (self.workspace / "smoke" / "test_smoke.py").write_text(SMOKE_TEST)
        self.python = root / "python"
        self.python.write_text(FAKE_PYTHON.format(python=sys.executable))
        self.python.chmod(self.python.stat().st_mode | stat.S_IXUSR)
        self.pip_log = root / "pip.log"
        self.runs = 0

    def run(self, event_name: str, event: dict[str, Any], **inputs: str) -> JobResult:
        self.runs += 1
        scratch = self.root / f"run{self.runs}"
        (scratch / "temp").mkdir(parents=True)
        event_path = scratch / "event.json"
        event_path.write_text(json.dumps(event))
        env = {
            **clean_environ(),
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_ACTION_PATH": str(ACTION.parent),
            "GITHUB_WORKSPACE": str(self.workspace),
            "GITHUB_EVENT_NAME": event_name,
            "GITHUB_EVENT_PATH": str(event_path),
            "GITHUB_REPOSITORY": REPO,
            "GITHUB_API_URL": self.github.url,
            "GITHUB_SERVER_URL": "https://github.example",
            "GITHUB_JOB": "smoke",
            "GITHUB_RUN_ID": str(1000 + self.runs),
            "RUNNER_TEMP": str(scratch / "temp"),
            "PIP_LOG": str(self.pip_log),
        }
        defaults = {
            "python": str(self.python),
            "working-directory": "smoke",
            "baseline": "perf/baseline.json",
            "pytest-args": "test_smoke.py -q -p no:cacheprovider -p no:hypothesispytest "
                           "-k 'not deselected'",
        }
        github_ctx = {"token": TOKEN, "job": "smoke", "event_name": event_name}
        return run_composite(
            ACTION, {**defaults, **inputs}, env=env, workspace=self.workspace,
            github=github_ctx, scratch=scratch,
        )  # fmt: skip


def pr_event(number: int = PR) -> dict[str, Any]:
    repo = {"full_name": REPO}
    return {
        "number": number,
        "pull_request": {
            "number": number,
            "head": {"sha": "a" * 40, "repo": repo},
            "base": {"sha": "b" * 40, "repo": repo},
        },
    }


def outputs_exist(result: JobResult) -> None:
    for key in ("report-path", "summary-path"):
        assert Path(result.outputs[key]).is_file(), key


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    fake = FakeGitHub(TOKEN).start()
    fake.add_pr(REPO, PR)
    yield Job(tmp_path_factory.mktemp("action"), fake)
    fake.stop()


@pytest.fixture(scope="module")
def first_run(job: Job) -> JobResult:
    return job.run("pull_request", pr_event(), comment="always")


def test_first_run_without_baseline_passes_and_comments(job: Job, first_run: JobResult) -> None:
    result = first_run
    assert not result.failed, [(s.name, s.stdout[-2000:], s.stderr[-2000:]) for s in result.steps]
    assert result.outputs["verdict"] == "no-baseline"
    assert result.outputs["failed"] == "false"
    assert result.outputs["comment-mode"] == "upsert"
    outputs_exist(result)
    head = json.loads(Path(result.outputs["summary-path"]).read_text())
    assert list(head["summaries"]) == ["tiny"]

    assert "No baseline at `perf/baseline.json`" in result.step_summary
    assert "verdict **no-baseline**" in result.step_summary
    assert "::notice title=traceml-ci::No baseline" in result.step("Run the smoke tests").stdout

    [posted] = job.github.bodies(REPO, PR)
    assert posted.startswith(marker_for("smoke") + "\n")
    upload = result.step("Upload")
    assert upload.ran and upload.uses and upload.uses.startswith("actions/upload-artifact@")
    assert upload.with_["name"] == result.outputs["artifact-name"] == "traceml-ci-smoke"
    artifact = Path(upload.with_["path"])
    assert {p.name for p in artifact.iterdir()} >= {"report.md", "summaries.json", "comment.json"}
    assert not result.step("Fail").ran
    # install: the action's own checkout, i.e. this repository
    [pip] = job.pip_log.read_text().splitlines()
    assert Path(pip.split()[-1]).resolve() == ROOT


def test_regression_fails_the_job_and_edits_the_same_comment(
    job: Job, first_run: JobResult
) -> None:
    baseline = job.workspace / "smoke" / "perf" / "baseline.json"
    baseline.parent.mkdir(exist_ok=True)
    baseline.write_text(json.dumps(slowed_baseline(Path(first_run.outputs["summary-path"]))))

    result = job.run("pull_request", pr_event(), install="skip")
    gate = result.step("Run the smoke tests")
    assert gate.exit_code == 0, gate.stderr[-3000:]
    assert result.outputs["verdict"] == "regression", result.step_summary
    assert result.outputs["failed"] == "true"
    assert gate.outputs["pytest-exit-code"] == "1"  # the plugin failed the test itself
    assert "::error title=traceml-ci::performance regression" in gate.stdout
    assert "regression" in result.step_summary.lower()
    assert result.step("Comment").exit_code == 0
    assert result.step("Upload").ran
    fail = result.step("Fail")
    assert fail.ran and fail.exit_code == 1 and "regression" in fail.stderr
    assert result.failed

    [posted] = job.github.bodies(REPO, PR)  # still one comment, now with the regression
    assert posted.startswith(marker_for("smoke")) and "regress" in posted.lower()


def test_a_deselected_test_gives_the_same_verdict_in_report_and_outputs(
    job: Job, first_run: JobResult
) -> None:
    # The baseline has an entry for a traced test this job deselects: the plugin's report and
    # the Action's verdict come from one comparison, in which that entry is "not run".
    doc = json.loads(Path(first_run.outputs["summary-path"]).read_text())
    doc["summaries"]["deselected"] = doc["summaries"]["tiny"]
    baseline = job.workspace / "smoke" / "perf" / "baseline.json"
    baseline.parent.mkdir(exist_ok=True)
    baseline.write_text(json.dumps(doc))
    result = job.run("push", {}, install="skip")
    gate = result.step("Run the smoke tests")
    assert gate.exit_code == 0, gate.stderr[-3000:]
    report = Path(result.outputs["report-path"]).read_text()
    comparison = json.loads(Path(gate.outputs["comparison-path"]).read_text())
    verdict = result.outputs["verdict"]
    assert verdict == comparison["verdict"] and verdict in ("pass", "warn"), (  # warn: busy
        comparison.get("reasons"))
    assert report.splitlines()[1].startswith(f"**{'✅' if verdict == 'pass' else '⚠️'} "
                                             f"traceml-ci {verdict}: 1 compared")
    assert "not run in this session (not compared): deselected" in report
    assert comparison["removed"] == [] and "removed" not in report
    assert not result.failed


def test_the_ab_base_input_reaches_pytest(tmp_path: Path, github: FakeGitHub) -> None:
    # A workspace that is a git repository; the ref does not exist there, so the plugin (the
    # real one, in the real pytest) stops at start-up with its one line: the input got through
    # env:, action-gate and pytest's command line, and no torch was imported on the way.
    job = Job(tmp_path, github)
    git = ["git", "-C", str(job.workspace), "-c", "user.name=t", "-c", "user.email=t@e.com"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    result = job.run("pull_request", pr_event(), install="skip", baseline="",
                     **{"ab-base": "no-such-ref"})  # fmt: skip
    gate = result.step("Run the smoke tests")
    assert gate.exit_code == 0, gate.stderr[-3000:]
    assert "--traceml-ab=no-such-ref" in gate.stdout  # the command action-gate ran
    assert "--traceml-baseline" not in gate.stdout
    assert "ERROR: traceml: --traceml-ab 'no-such-ref': no such commit, branch or tag" in (
        gate.stderr + gate.stdout)
    assert (result.outputs["verdict"], result.outputs["failed"]) == ("error", "true")
    assert gate.outputs["reason"] == "pytest failed (exit 4)"
    assert result.step("Fail").ran and result.failed
