"""--traceml-confirm=K: a traced test that looks like a regression, or comes close, runs again,
up to K more times, and fails only if all its runs combined still regress; a clean first run
costs one run."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.pytest_plugin.conftest import SmokeProject, shared_smoke
from tests.pytest_plugin.script_sessions import script_sessions
from tests.pytest_plugin.shared import once_per_session, result_data, result_from
from tests.pytest_plugin.test_repeats import ONE_TEST


def _calls(smoke: SmokeProject) -> list[str]:
    log = smoke.path / "calls.log"
    calls = log.read_text().split() if log.exists() else []
    log.unlink(missing_ok=True)
    return calls


@pytest.fixture(scope="module")
def recorded(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """ONE_TEST's baseline, recorded once for the tests below (an in-process session of three
    runs, the default: so one disturbed run on a busy machine does not become it): its session,
    the runs it made, the baseline file's text."""

    def produce() -> dict[str, Any]:
        with shared_smoke(request, tmp_path_factory) as smoke:
            smoke.tests(ONE_TEST)
            result = smoke.run("--traceml-update-baseline")
            return {"result": result_data(result), "calls": _calls(smoke),
                    "baseline": smoke.baseline.read_text() if smoke.baseline.is_file() else None}

    done = once_per_session(tmp_path_factory, "confirm-recorded", produce)
    return {**done, "result": result_from(done["result"])}


def _against_recorded(smoke: SmokeProject, recorded: dict[str, Any]) -> None:
    """ONE_TEST in ``smoke``'s project, with the recorded baseline."""
    recorded["result"].assert_outcomes(passed=1)
    smoke.tests(ONE_TEST)
    smoke.baseline.write_text(recorded["baseline"])


def test_clean_run_costs_one_run_and_a_real_slowdown_fails_after_confirmation(
    smoke: SmokeProject, recorded: dict[str, Any],
) -> None:
    _against_recorded(smoke, recorded)

    clean = smoke.run()
    clean.assert_outcomes(passed=1)
    # (A CPU hog beside may disturb one run: then it is re-run, and the line says so.)
    if "re-run" not in clean.stdout.str() and "came close" not in clean.stdout.str():
        assert _calls(smoke) == ["1"]  # nothing to confirm: one run
    _calls(smoke)

    smoke.slow_data()  # every run +10 ms per batch: a real slowdown
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


def test_a_slow_first_run_alone_passes_with_a_note(smoke: SmokeProject,
                                                   recorded: dict[str, Any]) -> None:
    _against_recorded(smoke, recorded)

    smoke.slow_data(calls="1")  # slow once (a busy runner), then normal
    result = smoke.run("--traceml-report=report.md", "--traceml-comparison=comparison.json")
    result.assert_outcomes(passed=1)
    calls = _calls(smoke)
    assert calls[:2] == ["1", "2"] and len(calls) <= 3  # stops once the runs combined pass
    result.stdout.re_match_lines([
        r"(PASS|WARN) +test_smoke.py::test_mlp( \(×[123] runs?\))?  .*; the first run looked like "
        r"a regression; not confirmed by [12] re-run\(s\) \((\d+ runs combined|"
        r"[12] re-run\(s\) combined, the first run left out)\)",
    ])
    # The runs the verdict stands on, counted alike in the label and the note (not ×2 … 3).
    line = next(ln for ln in result.stdout.lines if "not confirmed by" in ln)
    label = re.search(r"\(×(\d+) runs?\)", line)
    said = re.search(r"\((\d+) (?:runs combined|re-run\(s\) combined, the first)", line)
    assert said and (label is None or label.group(1) == said.group(1)), line
    # The report and the comparison come from the same, confirmed, comparison.
    verdict = json.loads((smoke.path / "comparison.json").read_text())["verdict"]
    assert verdict in ("pass", "warn")
    assert f"traceml-ci {verdict}:" in (smoke.path / "report.md").read_text().splitlines()[1]

    smoke.run("--traceml-confirm=0").assert_outcomes(failed=1)  # the same first run, unconfirmed


@pytest.fixture(scope="module")
def script(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return script_sessions(request, tmp_path_factory)


def test_run_script_confirms_by_running_the_script_again(script) -> None:
    """A traced script (``traceml.run_script``) is confirmed by running the script again: a
    baseline of three runs, then a session whose first run alone is slow (script_sessions.py)."""
    script["recorded"]["result"].assert_outcomes(passed=1)
    assert script["recorded"]["runs"] == 3
    result = script["confirmed"]["result"]
    result.assert_outcomes(passed=1)
    assert script["confirmed"]["runs"] in (2, 3)
    result.stdout.re_match_lines([r".*test_script .*not confirmed by [12] re-run\(s\)"])


#: Shares warn past 5 pp and fail only past 95 (the labels are not gated): the injected slowdown
#: (~+70 pp of dataloader share) comes close without regressing, whatever the machine's load.
#: ``fail = true``: these tiers, not the host clock's band, judge the shares (a user who asks
#: for timings to decide on a CPU runner gets the confirmation that goes with it).
CLOSE_ONLY = '''
[tolerances]
"step_time.step_ms.median" = {rel = 2000, warn_rel = 1000}
"step_time.*_pct" = {abs = 95, warn_abs = 5, fail = true}
"step_time.cpu_ms" = {skip = true}
"step_time.diagnosis" = {skip = true}
"step_memory.*" = {skip = true}
'''


def test_a_first_run_that_came_close_is_re_run_before_its_verdict(
    smoke: SmokeProject, recorded: dict[str, Any],
) -> None:
    _against_recorded(smoke, recorded)  # (a baseline is the runs' summaries: no rules in it)
    smoke.tolerances.write_text(CLOSE_ONLY)

    smoke.slow_data()
    result = smoke.run()
    result.assert_outcomes(passed=1)
    assert _calls(smoke) == ["1", "2", "3"]  # each combination still came close
    result.stdout.re_match_lines([
        r"WARN +test_smoke.py::test_mlp \(×3 runs\)  .*; the first run came close; not a "
        r"regression over 3 runs combined",
    ])

    smoke.run("--traceml-confirm=0").assert_outcomes(passed=1)
    assert _calls(smoke) == ["1"]  # nothing re-run when told so


def test_a_baseline_is_recorded_from_three_runs_by_default(smoke: SmokeProject,
                                                           recorded: dict[str, Any]) -> None:
    first = recorded["result"]  # --traceml-update-baseline, nothing else
    first.assert_outcomes(passed=1)
    assert recorded["calls"] == ["1", "2", "3"]
    first.stdout.fnmatch_lines(["traceml: baseline * (no file yet, updating), rules: *, "
                                "3 runs combined", "UPDATED *test_mlp (×3 runs)  new entry*"])
    entry = json.loads(recorded["baseline"])["summaries"]["test_smoke.py::test_mlp"]
    assert entry["repeats"]["count"] == 3  # the runs' spread is part of the entry's noise

    _against_recorded(smoke, recorded)
    smoke.run("--traceml-update-baseline", "--traceml-baseline-runs=1").assert_outcomes(passed=1)
    assert _calls(smoke) == ["1"]
    assert "repeats" not in smoke.baseline_summaries()["test_smoke.py::test_mlp"]
    refused = smoke.run("--traceml-update-baseline", "--traceml-baseline-runs=0")
    assert refused.ret == 4
    refused.stderr.fnmatch_lines(["*--traceml-baseline-runs must be at least 1, not 0*"])
