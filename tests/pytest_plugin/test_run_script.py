"""``traceml.run_script``: a script traced by ``traceml-ci run`` in a subprocess, gated like a
marked test."""

from __future__ import annotations

import subprocess

import pytest

from pytest_plugin import scripts
from tests.pytest_plugin.conftest import SmokeProject

#: No torch.optim: its first use costs seconds of imports, and this runs in a fresh process.
SCRIPT = '''
import sys

import torch
from torch import nn

import traceml_ci as traceml

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
x, y = torch.randn(32, 64), torch.randn(32, 1)
for _ in range(int(sys.argv[1])):
    with traceml.trace_step(model):
        model.zero_grad(set_to_none=True)
        ((model(x) - y) ** 2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
print("trained")
'''

SCRIPT_TEST = '''
def test_script(traceml):
    summary = traceml.run_script("train_script.py", 30, warmup_steps=3)
    assert traceml.summary is summary
    st = summary["step_time"]
    assert (st["steps_total"], st["warmup_steps"], st["steps_analyzed"]) == (30, 3, 27)
    assert summary["run"]["name"] == "test_smoke.py::test_script"
'''


def test_run_script_is_traced_gated_and_stored(smoke: SmokeProject) -> None:
    smoke.pytester.makepyfile(train_script=SCRIPT)
    smoke.tests(SCRIPT_TEST)
    result = smoke.run("--traceml-update-baseline")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["UPDATED *test_smoke.py::test_script  new entry"])
    assert list(smoke.baseline_summaries()) == ["test_smoke.py::test_script"]


def test_a_failing_script_fails_the_test_with_its_output(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    def fake_run(cmd, **kwargs):
        assert cmd[3:7] == ["run", "--out", str(tmp_path), "--run-name"]
        return subprocess.CompletedProcess(cmd, 3, stdout="step 1\n", stderr="Boom: bad data\n")

    monkeypatch.setattr(scripts.subprocess, "run", fake_run)
    with pytest.raises(scripts.ScriptFailed) as info:
        scripts.traced_script(tmp_path / "s.py", [], out_dir=tmp_path, run_name="k")
    assert str(info.value).splitlines() == [
        f"traceml: {tmp_path / 's.py'} exited with code 3", "step 1", "Boom: bad data"]


def test_a_script_that_times_out(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    def fake_run(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(scripts.subprocess, "run", fake_run)
    with pytest.raises(scripts.ScriptFailed, match="did not finish within 5 s"):
        scripts.traced_script(tmp_path / "s.py", [], out_dir=tmp_path, run_name="k", timeout_s=5)
