"""Per-test memory: a traced test's own peak RSS (``step_memory.peak_job_rss_mb``) does not
depend on the tests that ran before it in the same process; the process's lifetime peak
(``peak_rss_mb``) does, so the plugin gates the former."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.pytest_plugin.conftest import shared_smoke
from tests.pytest_plugin.shared import once_per_session, result_data, result_from

HEAVY_MB = 200

TESTS = f'''
import pytest

from smoke_train import train

KEPT = []


def test_0_warm():
    train()  # torch's one-time allocations happen here, not in the first traced test


@pytest.mark.traceml(key="before")
def test_1_traced_before():
    train()


def test_2_heavy():
    KEPT.append(bytearray(b"x") * ({HEAVY_MB} * 1024 * 1024))  # touched pages: real RSS, kept


@pytest.mark.traceml(key="after")
def test_3_traced_after():
    train()


def test_4_heavy_after():
    KEPT.append(bytearray(b"x") * ({HEAVY_MB} * 1024 * 1024))
'''


#: A test whose first run in a process pays a one-time cost that its later runs reuse (as a
#: lazy import or a first-use cache does): 60 MB kept from the first call on. Last in the
#: module: the heavy tests before it are no part of its own memory either.
ONCE_TEST = '''

ONCE = []


@pytest.mark.traceml(key="once")
def test_5_first_run_pays_once():
    if not ONCE:
        ONCE.append(bytearray(b"x") * (60 * 1024 * 1024))
    train()
'''


@pytest.fixture(scope="module")
def sessions(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two sessions, each in its own process (the lifetime peak starts from nothing): the
    baselines of the first traced test and of the once-paying one recorded (three runs each,
    the default) with no heavy test in the process, then every test gated against them, the
    traced summaries saved. The tests below assert different things on them; a session of a
    fresh process costs seconds (torch), so they are run once per test session (shared.py)."""

    def produce() -> dict[str, Any]:
        with shared_smoke(request, tmp_path_factory) as smoke:
            smoke.tests(TESTS + ONCE_TEST)
            rules = smoke.path / "memory.toml"  # memory at its default tolerance; shares loose
            rules.write_text('[tolerances]\n"step_time.*" = {skip = true}\n')
            base = [f"--traceml-baseline={smoke.baseline}", f"--traceml-tolerances={rules}"]
            recorded = smoke.run(*base, "--traceml-update-baseline", "-k",
                                 "warm or traced_before or pays_once", gate=False,
                                 subprocess=True)
            entries = smoke.baseline_summaries() if smoke.baseline.is_file() else {}
            # The test after the heavy one is judged against the one before it recorded alone.
            smoke.baseline.write_text(smoke.baseline.read_text().replace('"before"', '"after"'))
            report, save = smoke.path / "comparison.json", smoke.path / "heads.json"
            gated = smoke.run(*base, f"--traceml-comparison={report}", "--traceml-confirm=0",
                              f"--traceml-save={save}", gate=False, subprocess=True)
            return {"recorded": result_data(recorded), "entries": entries,
                    "gated": result_data(gated),
                    "comparison": json.loads(report.read_text()) if report.is_file() else None,
                    "save": json.loads(save.read_text()) if save.is_file() else None}

    done = once_per_session(tmp_path_factory, "memory-sessions", produce)
    return {**done, "recorded": result_from(done["recorded"]),
            "gated": result_from(done["gated"])}


def test_a_heavy_test_before_does_not_move_a_traced_tests_memory(sessions) -> None:
    sessions["gated"].assert_outcomes(passed=6)
    mem = {k: s["step_memory"] for k, s in sessions["save"]["summaries"].items()}
    before, after = mem["before"], mem["after"]
    # The heavy test keeps HEAVY_MB alive across the traced test after it (the process's
    # lifetime peak is no contrast to assert: in a loaded suite start-up transients can exceed
    # it); the traced test's own figure does not move: the same body uses the same memory.
    assert abs(after["peak_job_rss_mb"] - before["peak_job_rss_mb"]) <= 20, mem
    assert 0 <= before["peak_job_rss_mb"] < 0.5 * HEAVY_MB


def test_the_plugin_gates_the_tests_own_memory_not_the_process_peak(sessions) -> None:
    sessions["recorded"].assert_outcomes(passed=3, deselected=3)
    # Against a baseline recorded alone, the same test after a 200 MB test is not a regression.
    sessions["gated"].assert_outcomes(passed=6)
    rows = {r["name"]: r for r in sessions["comparison"]["items"]["after"]["rows"]}
    assert "step_memory.peak_rss_mb" not in rows  # the process's: not this test's to answer for
    assert rows["step_memory.peak_job_rss_mb"]["status"] in ("ok", "improved", "warn")


def test_a_baseline_of_several_runs_keeps_the_first_runs_memory(sessions) -> None:
    """Three baseline runs in one process: the re-runs reuse the first one's memory, so the
    entry keeps the largest peak, the one a fresh session's first run is compared with."""
    entry = sessions["entries"]["once"]
    assert entry["repeats"]["count"] == 3
    assert entry["step_memory"]["peak_job_rss_mb"] >= 50  # the first run's, not the median's
    rows = {r["name"]: r for r in sessions["comparison"]["items"]["once"]["rows"]}
    assert rows["step_memory.peak_job_rss_mb"]["status"] in ("ok", "improved", "warn")
