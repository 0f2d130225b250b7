"""--traceml-repeats=N: the test body runs N times, each under a fresh tracer; the runs are
combined (each share's mean, their spread as noise), gated and stored."""

from __future__ import annotations

import json
import os

import pytest

from tests.pytest_plugin.conftest import SLOW_DATA_20_MS, SmokeProject

ONE_TEST = '''
import pytest

from smoke_train import train


@pytest.mark.traceml
def test_mlp():
    calls = train()
    with open("calls.log", "a") as fh:
        fh.write(f"{calls}\\n")
'''


def test_one_slow_run_of_three_does_not_fail_but_two_do(smoke: SmokeProject) -> None:
    smoke.tests(ONE_TEST)
    smoke.run("--traceml-update-baseline").assert_outcomes(passed=1)
    log = smoke.path / "calls.log"
    log.unlink()

    # the second of three runs is +20 ms per batch: how one slow run's share weighs against
    # two clean ones' (and two against one) is what this test is about
    smoke.slow_data(SLOW_DATA_20_MS, calls="2")
    result = smoke.run("--traceml-repeats=3")
    result.assert_outcomes(passed=1)
    # Three repeats; a loaded machine can leave their mean just past tolerance, and then a
    # confirmation re-run (run 4, alone) settles it: either way the test passes.
    calls = log.read_text().split()
    assert calls[:3] == ["1", "2", "3"] and len(calls) <= 5, calls
    result.stdout.fnmatch_lines(["traceml: baseline * (1 entries), rules: *, 3 runs combined"])
    result.stdout.re_match_lines([r"(PASS|WARN) +test_smoke.py::test_mlp( \(×\d runs\))?  "])

    # Two slow runs of three: the mean share moves beyond noise (no confirmation re-runs here:
    # this test is about the three repeats alone).
    smoke.slow_data(SLOW_DATA_20_MS, calls="1,3")
    result = smoke.run("--traceml-repeats=3", "--traceml-confirm=0")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "traceml: regression for test_smoke.py::test_mlp (3 runs combined) against *",
        "REGRESSION *test_smoke.py::test_mlp (×3 runs)  step_time.dataloader_pct: *",
    ])

    # Without repeats (and without confirmation) the same slow first run fails on its own.
    smoke.slow_data(SLOW_DATA_20_MS, calls="1")
    smoke.run("--traceml-confirm=0").assert_outcomes(failed=1)


CONTENDED_TEST = '''
import subprocess
import sys

import pytest

from smoke_train import train


@pytest.mark.traceml
def test_mlp():
    # Three busy loops beside the training on a machine of a few cores: its main thread waits
    # for a CPU for a good part of the run, as on a shared runner.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        train()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
'''


def test_a_baseline_recorded_on_a_contended_cpu_says_so_and_keeps_the_figure(
    smoke: SmokeProject,
) -> None:
    if (os.cpu_count() or 1) > 4:
        pytest.skip("three busy loops contend only on a machine of a few cores")
    smoke.tests(CONTENDED_TEST)
    # Two runs combined (not the default three): each keeps three busy loops for its length.
    result = smoke.run("--traceml-update-baseline", "--traceml-baseline-runs=2")
    result.assert_outcomes(passed=1)
    entry = json.loads(smoke.baseline.read_text())["summaries"]["test_smoke.py::test_mlp"]
    wait = entry["run"]["contention"]["runqueue_wait_pct"]
    # the entry (its runs combined) keeps the most any run waited; the update line says so
    assert wait is not None and wait >= 10 and entry["repeats"]["count"] >= 2, entry["run"]
    result.stdout.fnmatch_lines([
        "UPDATED *test_smoke.py::test_mlp (×* runs)  new entry; recorded on a contended CPU "
        "(runqueue wait * %): re-record it on a quiet runner",
    ])
