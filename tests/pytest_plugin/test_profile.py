"""--traceml-profile-on-regression: a regressed test runs once more under torch.profiler; its
chrome trace is kept and its top ops (and, against a --traceml-profile baseline, their deltas)
are in the failure and the report. It never changes a verdict."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.pytest_plugin.conftest import SLOW_DATA_20_MS, SmokeProject
from tests.pytest_plugin.script_sessions import script_sessions
from tests.pytest_plugin.test_repeats import ONE_TEST

#: One run per baseline and no confirmation: these tests are about what follows the verdict.
RECORD = ("--traceml-update-baseline", "--traceml-baseline-runs=1")
GATE = ("--traceml-confirm=0", "--traceml-profile-on-regression", "--traceml-profile-steps=3")

#: The profiler's start fails in the inner session (an autouse fixture: restored after the test).
BROKEN_PROFILER = '''
import pytest
import torch.profiler


class _Broken:
    def __init__(self, **_):
        pass

    def start(self):
        raise RuntimeError("no kineto here")


@pytest.fixture(autouse=True)
def _broken_profiler(monkeypatch):
    monkeypatch.setattr(torch.profiler, "profile", _Broken)
'''

def _trace_of(stdout: str) -> Path:
    found = re.findall(r"^traceml: profile of \S+: (\S+trace\.json) \((.*)\)$", stdout, re.M)
    assert len(found) == 1, stdout
    trace = Path(found[0][0])
    # The figures asked for (time of the profiled re-run, trace size), shown with -s.
    print(f"\nprofiled re-run: {found[0][1]}; trace {trace.stat().st_size:,} bytes")
    return trace


def test_a_regression_is_profiled_with_op_deltas_against_a_profiled_baseline(
    smoke: SmokeProject,
) -> None:
    smoke.tests(ONE_TEST)
    recorded = smoke.run(*RECORD, "--traceml-profile")
    recorded.assert_outcomes(passed=1)
    recorded.stdout.fnmatch_lines(["UPDATED *test_smoke.py::test_mlp  new entry*top ops recorded*"])
    entry = smoke.baseline_summaries()["test_smoke.py::test_mlp"]
    base_ops = [op["name"] for op in entry["profile"]["ops"]]
    assert "aten::addmm" in base_ops and entry["profile"]["steps"] == 5  # the default

    smoke.slow_data(SLOW_DATA_20_MS)  # (its op's change, not only the verdict, is asserted)
    report = smoke.path / "report.md"
    slowed = smoke.run(*GATE[:2], f"--traceml-report={report}")  # the default 5 steps
    slowed.assert_outcomes(failed=1)
    out = slowed.stdout.str()
    slowed.stdout.fnmatch_lines([
        "traceml: regression for test_smoke.py::test_mlp against *",
        "traceml: profile of a re-run under torch.profiler (5 profiled steps on cpu, re-run *"
        " s, trace * kB)",
        "top ops by self time:",
        "op * host ms/step * calls/step * share",
        "largest changes, base -> head:",
    ])
    assert re.search(r"^aten::addmm +\S+ +3\.00 ", out, re.M), out  # three Linear forwards a step
    # The injected slowdown (a 20 ms busy-wait in the dataset per batch) is among the largest
    # changes, base -> head, at about its size. Quiet, it is the largest; beside two busy loops
    # a preempted op can outgrow it (aten::addmm +24.7 ms/step, seen once).
    deltas = out.split("largest changes, base -> head:", 1)[1].splitlines()
    row = next((d for d in deltas[3:8] if d.startswith("enumerate(DataLoader)")), None)
    assert row is not None, deltas[:8]
    assert float(row.split()[-1]) >= 0.5 * float(SLOW_DATA_20_MS), row
    trace = _trace_of(out)
    doc = json.loads(trace.read_text())  # loadable: Perfetto / chrome://tracing / HTA
    assert any(e.get("name") == "aten::addmm" for e in doc["traceEvents"])
    steps = {e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    assert len(steps) == 5
    md = report.read_text()
    assert "### Profiles of regressed tests" in md and "#### test_smoke.py::test_mlp" in md
    assert "| aten::addmm" in md and "Largest changes, base → head" in md
    # the verdict is the gate's: the same regression with and without the profile
    assert "REGRESSION" in out and "warning: could not profile" not in out


def test_a_passing_test_takes_no_profile_and_without_a_profiled_baseline_no_deltas(
    smoke: SmokeProject,
) -> None:
    smoke.tests(ONE_TEST)
    smoke.run(*RECORD).assert_outcomes(passed=1)
    profiles = smoke.path / "profiles"
    clean = smoke.run(*GATE, f"--traceml-profile-dir={profiles}")
    clean.assert_outcomes(passed=1)
    assert "profile of" not in clean.stdout.str() and "top ops" not in clean.stdout.str()
    assert "could not profile" not in clean.stdout.str()
    assert not profiles.exists()

    smoke.slow_data()
    slowed = smoke.run(*GATE, f"--traceml-profile-dir={profiles}")
    slowed.assert_outcomes(failed=1)
    trace = _trace_of(slowed.stdout.str())
    assert trace.is_relative_to(profiles) and trace.is_file()
    assert "top ops by self time:" in slowed.stdout.str()
    assert "largest changes" not in slowed.stdout.str()  # the baseline has no top ops


def test_a_profiler_that_fails_leaves_the_verdict_and_warns_once(smoke: SmokeProject) -> None:
    smoke.tests(ONE_TEST)
    smoke.run(*RECORD).assert_outcomes(passed=1)
    smoke.pytester.makeconftest(BROKEN_PROFILER)
    smoke.slow_data()
    failed = smoke.run(*GATE)
    failed.assert_outcomes(failed=1)
    out = failed.stdout.str()
    assert "traceml: regression for test_smoke.py::test_mlp" in out
    assert out.count("traceml: warning: could not profile test_smoke.py::test_mlp") == 1
    assert "top ops by self time" not in out
    # Report-only: the regression is reported, the test passes, profile or not.
    passed = smoke.run(*GATE, "--traceml-report-only")
    passed.assert_outcomes(passed=1)
    assert passed.stdout.str().count("warning: could not profile") == 1
    assert passed.ret == pytest.ExitCode.OK


@pytest.fixture(scope="module")
def script(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return script_sessions(request, tmp_path_factory)


def test_a_run_script_regression_is_profiled_in_its_child(script) -> None:
    """A traced script's regression (its run slowed, no confirmation) is profiled in a re-run
    of the script (the session shared with test_confirm.py and test_run_script.py)."""
    slowed = script["profiled"]["result"]
    slowed.assert_outcomes(failed=1)
    assert script["profiled"]["runs"] == 2  # the run, then the profiled re-run
    trace = _trace_of(slowed.stdout.str())
    assert "traceEvents" in json.loads(trace.read_text())
    assert re.search(r"^aten::addmm ", slowed.stdout.str(), re.M)


def test_profile_options_are_checked(smoke: SmokeProject) -> None:
    smoke.tests(ONE_TEST)
    bad = smoke.run("--traceml-profile")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--traceml-profile needs --traceml-update-baseline*"])
    steps = smoke.run("--traceml-profile-steps=0")
    assert steps.ret == pytest.ExitCode.USAGE_ERROR
    steps.stderr.fnmatch_lines(["*--traceml-profile-steps must be at least 1, not 0*"])
