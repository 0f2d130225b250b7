"""Per-test memory: a traced test's own peak RSS (``step_memory.peak_job_rss_mb``) does not
depend on the tests that ran before it in the same process; the process's lifetime peak
(``peak_rss_mb``) does, so the plugin gates the former."""

from __future__ import annotations

import json

from tests.pytest_plugin.conftest import SmokeProject

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


def test_a_heavy_test_before_does_not_move_a_traced_tests_memory(smoke: SmokeProject) -> None:
    smoke.tests(TESTS)
    save = smoke.path / "heads.json"
    # Its own process: the lifetime peak must start from nothing for the contrast below.
    result = smoke.run(f"--traceml-save={save}", gate=False, subprocess=True)
    result.assert_outcomes(passed=5)
    mem = {k: s["step_memory"] for k, s in json.loads(save.read_text())["summaries"].items()}
    before, after = mem["before"], mem["after"]
    # The heavy test keeps HEAVY_MB alive across the traced test after it (the process's
    # lifetime peak is no contrast to assert: in a loaded suite start-up transients can exceed
    # it); the traced test's own figure does not move: the same body uses the same memory.
    assert abs(after["peak_job_rss_mb"] - before["peak_job_rss_mb"]) <= 20, mem
    assert 0 <= before["peak_job_rss_mb"] < 0.5 * HEAVY_MB


def test_the_plugin_gates_the_tests_own_memory_not_the_process_peak(
    smoke: SmokeProject,
) -> None:
    smoke.tests(TESTS)
    report = smoke.path / "comparison.json"
    rules = smoke.path / "memory.toml"  # memory at its default tolerance; shares loose
    rules.write_text('[tolerances]\n"step_time.*" = {skip = true}\n')
    base = [f"--traceml-baseline={smoke.baseline}", f"--traceml-tolerances={rules}"]
    smoke.run(*base, "--traceml-update-baseline", "-k", "warm or traced_before", gate=False,
              subprocess=True).assert_outcomes(passed=2)
    # Against a baseline recorded alone, the same test after a 200 MB test is not a regression.
    smoke.baseline.write_text(smoke.baseline.read_text().replace('"before"', '"after"'))
    result = smoke.run(*base, f"--traceml-comparison={report}", "--traceml-confirm=0",
                       "-k", "not before", gate=False, subprocess=True)
    result.assert_outcomes(passed=4)
    rows = {r["name"]: r for r in json.loads(report.read_text())["items"]["after"]["rows"]}
    assert "step_memory.peak_rss_mb" not in rows  # the process's: not this test's to answer for
    assert rows["step_memory.peak_job_rss_mb"]["status"] in ("ok", "improved", "warn")


#: A test whose first run in a process pays a one-time cost that its later runs reuse (as a
#: lazy import or a first-use cache does): 60 MB kept from the first call on.
ONCE_TESTS = '''
import pytest

from smoke_train import train

ONCE = []


@pytest.mark.traceml(key="once")
def test_first_run_pays_once():
    if not ONCE:
        ONCE.append(bytearray(b"x") * (60 * 1024 * 1024))
    train()
'''


def test_a_baseline_of_several_runs_keeps_the_first_runs_memory(smoke: SmokeProject) -> None:
    """Three baseline runs in one process: the re-runs reuse the first one's memory, so the
    entry keeps the largest peak, the one a fresh session's first run is compared with."""
    smoke.tests(ONCE_TESTS)
    rules = smoke.path / "memory.toml"
    rules.write_text('[tolerances]\n"step_time.*" = {skip = true}\n')
    base = [f"--traceml-baseline={smoke.baseline}", f"--traceml-tolerances={rules}"]
    smoke.run(*base, "--traceml-update-baseline", gate=False,
              subprocess=True).assert_outcomes(passed=1)
    entry = smoke.baseline_summaries()["once"]
    assert entry["repeats"]["count"] == 3
    assert entry["step_memory"]["peak_job_rss_mb"] >= 50  # the first run's, not the median's
    report = smoke.path / "comparison.json"
    result = smoke.run(*base, f"--traceml-comparison={report}", "--traceml-confirm=0",
                       gate=False, subprocess=True)
    result.assert_outcomes(passed=1)
    rows = {r["name"]: r for r in json.loads(report.read_text())["items"]["once"]["rows"]}
    assert rows["step_memory.peak_job_rss_mb"]["status"] in ("ok", "improved", "warn")
