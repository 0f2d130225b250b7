"""--traceml-confirm=K: a traced test that looks like a regression runs again, up to K more
times, and fails only if all its runs combined still regress; a clean first run costs one run."""

from __future__ import annotations

import json

from tests.pytest_plugin.conftest import SmokeProject
from tests.pytest_plugin.test_repeats import ONE_TEST

SCRIPT_TEST = '''
import pytest

from smoke_train import train


def test_script(traceml):
    traceml.run_script("train_script.py", env={"SMOKE_PLAIN_SGD": "1"})
'''

SCRIPT = '''
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["SMOKE_SLOW_CALLS"] = os.environ.get("SCRIPT_SLOW_RUNS", "") and (
    "1" if str(len(os.listdir(os.environ["SCRIPT_RUNS_DIR"]))) in
    os.environ["SCRIPT_SLOW_RUNS"].split(",") else "0")
open(os.path.join(os.environ["SCRIPT_RUNS_DIR"], str(os.getpid())), "w").close()
from smoke_train import train

train()
'''


#: The baseline: three runs combined, so one disturbed run on a busy machine does not become it.
RECORD = ("--traceml-update-baseline", "--traceml-repeats=3")


def _calls(smoke: SmokeProject) -> list[str]:
    log = smoke.path / "calls.log"
    calls = log.read_text().split() if log.exists() else []
    log.unlink(missing_ok=True)
    return calls


def test_clean_run_costs_one_run_and_a_real_slowdown_fails_after_confirmation(
    smoke: SmokeProject,
) -> None:
    smoke.tests(ONE_TEST)
    smoke.run(*RECORD).assert_outcomes(passed=1)
    _calls(smoke)

    clean = smoke.run()
    clean.assert_outcomes(passed=1)
    if "not confirmed" not in clean.stdout.str():  # (a CPU hog beside may disturb one run)
        assert _calls(smoke) == ["1"]  # nothing to confirm: one run
    _calls(smoke)

    smoke.slow_data()  # every run +20 ms per batch: a real slowdown
    slowed = smoke.run()
    slowed.assert_outcomes(failed=1)
    assert _calls(smoke) == ["1", "2", "3"]  # the first run, then two confirming re-runs
    slowed.stdout.fnmatch_lines([
        "traceml: regression for test_smoke.py::test_mlp (3 runs combined) against *",
        "confirmed: 3 runs combined still regress (2 re-run(s))",
        "REGRESSION *test_smoke.py::test_mlp (×3 runs)  *; confirmed: *",
    ])

    bigger_k = smoke.run("--traceml-confirm=1")
    bigger_k.assert_outcomes(failed=1)
    assert _calls(smoke) == ["1", "2"]


def test_a_slow_first_run_alone_passes_with_a_note(smoke: SmokeProject) -> None:
    smoke.tests(ONE_TEST)
    smoke.run(*RECORD).assert_outcomes(passed=1)
    _calls(smoke)

    smoke.slow_data(calls="1")  # slow once (a busy runner), then normal
    result = smoke.run("--traceml-report=report.md", "--traceml-comparison=comparison.json")
    result.assert_outcomes(passed=1)
    calls = _calls(smoke)
    assert calls[:2] == ["1", "2"] and len(calls) <= 3  # stops once the runs combined pass
    result.stdout.re_match_lines([
        r"(PASS|WARN) +test_smoke.py::test_mlp( \(×[123] runs\))?  .*; the first run looked like "
        r"a regression; not confirmed by [12] re-run\(s\) \([23] runs in all\)",
    ])
    # The report and the comparison come from the same, confirmed, comparison.
    verdict = json.loads((smoke.path / "comparison.json").read_text())["verdict"]
    assert verdict in ("pass", "warn")
    assert f"traceml-ci {verdict}:" in (smoke.path / "report.md").read_text().splitlines()[1]

    smoke.run("--traceml-confirm=0").assert_outcomes(failed=1)  # the same first run, unconfirmed


def test_run_script_confirms_by_running_the_script_again(smoke: SmokeProject) -> None:
    smoke.tests(SCRIPT_TEST)
    (smoke.path / "train_script.py").write_text(SCRIPT)
    runs = smoke.path / "runs"
    runs.mkdir()
    smoke.monkeypatch.setenv("SCRIPT_RUNS_DIR", str(runs))
    smoke.monkeypatch.setenv("SMOKE_DATA_MS", "20")
    smoke.monkeypatch.setenv("SCRIPT_SLOW_RUNS", "999")  # no run slow
    smoke.run("--traceml-update-baseline").assert_outcomes(passed=1)
    for f in runs.iterdir():
        f.unlink()

    smoke.monkeypatch.setenv("SCRIPT_SLOW_RUNS", "0")  # only the first script run is slow
    result = smoke.run()
    result.assert_outcomes(passed=1)
    assert len(list(runs.iterdir())) in (2, 3)
    result.stdout.re_match_lines([r".*test_script .*not confirmed by [12] re-run\(s\)"])
