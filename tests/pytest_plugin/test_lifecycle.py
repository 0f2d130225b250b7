"""The baseline lifecycle in real pytest sessions: no baseline, update, pass, regress, report."""

from __future__ import annotations

import pytest

from tests.pytest_plugin.conftest import SmokeProject
from traceml_ci.gate.judging import HOST_BAND_SHARE_PP


def test_first_run_without_a_baseline_passes_with_a_note(smoke: SmokeProject) -> None:
    smoke.tests()
    result = smoke.run()
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([
        "*- traceml -*",
        "NO BASELINE *test_smoke.py::test_mlp  no baseline for test_smoke.py::test_mlp: "
        "run with --traceml-update-baseline",
        "NO BASELINE *test_smoke.py::test_mlp_short [[]key mlp-short[]]  no baseline for "
        "mlp-short: run with --traceml-update-baseline",
    ])
    assert "test_untraced" not in result.stdout.str().split("- traceml -")[1]
    assert not smoke.baseline.exists()  # never written without --traceml-update-baseline


def test_update_then_pass_then_regress(smoke: SmokeProject) -> None:
    smoke.tests()
    # Three runs combined by default (--traceml-baseline-runs): one disturbed run (a CPU hog
    # preempting a 2 ms step) would otherwise become the baseline every later run is judged
    # against.
    updated = smoke.run("--traceml-update-baseline")
    updated.assert_outcomes(passed=3)
    updated.stdout.fnmatch_lines([
        "UPDATED *test_smoke.py::test_mlp (×3 runs)  new entry*",
        f"traceml: baseline updated: {smoke.baseline} (2 written, 2 in all)",
    ])
    entries = smoke.baseline_summaries()
    assert sorted(entries) == ["mlp-short", "test_smoke.py::test_mlp"]
    assert entries["mlp-short"]["step_time"]["steps_total"] == 30  # max_steps
    assert entries["test_smoke.py::test_mlp"]["step_time"]["steps_total"] == 40
    assert entries["test_smoke.py::test_mlp"]["run"]["name"] == "test_smoke.py::test_mlp"
    recorded = smoke.baseline.read_bytes()

    rerun = smoke.run()
    rerun.assert_outcomes(passed=3)
    # A busy runner may make it a warning (step time +10%), never a failure.
    # A disturbed first run is re-run to confirm (then the line says "(×N runs)"). The label is
    # the head's, timed on the host clock: load may move a 3 ms step's (OPTIMIZER_BOUND, seen).
    rerun.stdout.re_match_lines([
        r"(PASS|WARN) +test_smoke.py::test_mlp (\(×\d runs\) )? [A-Z_]+, step .* ms "
        r"\(base .* ms\)",
        r"(PASS|WARN) +test_smoke.py::test_mlp_short \[key mlp-short\] (\(×\d runs\) )? "
        r"[A-Z_]+, ",
    ])
    assert smoke.baseline.read_bytes() == recorded  # gating never modifies the baseline

    smoke.slow_data()
    slowed = smoke.run()
    slowed.assert_outcomes(passed=1, failed=2)
    out = slowed.stdout.str()
    # The first run looked like a regression: two re-runs (the default --traceml-confirm=2)
    # confirmed it before the test failed.
    slowed.stdout.fnmatch_lines([
        "*_ test_mlp _*",
        f"traceml: regression for test_smoke.py::test_mlp (3 runs combined) against "
        f"{smoke.baseline}",
        "confirmed: 3 runs combined still regress (2 re-run(s))",
        "traceml-ci regression: * beyond tolerance and noise*",
        "Timings (host clock: they inform, *past the band: step_time.dataloader_pct*",
        f"*step_time.dataloader_pct: * → * (+* pp; tolerance +{HOST_BAND_SHARE_PP:g} pp "
        "host-clock band)*",
        "*step_time.dataloader_pct*regressed*",
        "If this change is intended, run with --traceml-update-baseline to accept it.",
    ])
    slowed.stdout.fnmatch_lines([
        "REGRESSION *test_smoke.py::test_mlp (×3 runs)  step_time.dataloader_pct: *; "
        "confirmed: 3 runs combined still regress (2 re-run(s))",
        "REGRESSION *test_smoke.py::test_mlp_short [[]key mlp-short[]] (×3 runs)  step_time*",
        "traceml: session verdict: regression (2 of 2 regressed: mlp-short, "
        "test_smoke.py::test_mlp)",
        "FAILED test_smoke.py::test_mlp - Failed: traceml: regression for *",
    ])
    assert "Traceback" not in out and "gating.py" not in out  # helper frames are hidden
    assert smoke.baseline.read_bytes() == recorded

    # Accepted from one run (the default three were recorded above): each is 40 slowed steps.
    accepted = smoke.run("--traceml-update-baseline", "--traceml-baseline-runs=1")
    accepted.assert_outcomes(passed=3)
    accepted.stdout.fnmatch_lines(["UPDATED *test_smoke.py::test_mlp  was regression*"])
    assert smoke.baseline_summaries()["test_smoke.py::test_mlp"]["step_time"]["diagnosis"] == (
        "INPUT_BOUND"
    )


#: One run a baseline where only a slowdown is judged against it, which fails whatever that run
#: was (a clean run judged against one run could fail on a label that run happened to miss);
#: the defaults' three runs and re-runs are test_update_then_pass_then_regress's.
ONE_RUN = ("--traceml-update-baseline", "--traceml-baseline-runs=1")


def test_report_file_is_the_gates_markdown(smoke: SmokeProject) -> None:
    smoke.tests()
    smoke.run(*ONE_RUN, "-k", "test_mlp_short").assert_outcomes(passed=1)
    report = smoke.path / "out" / "report.md"
    smoke.slow_data()
    result = smoke.run(f"--traceml-report={report}", "--traceml-confirm=0")
    result.assert_outcomes(passed=2, failed=1)  # test_mlp: no baseline; mlp-short regressed
    result.stdout.fnmatch_lines([f"traceml: report written: {report}"])
    text = report.read_text()
    lines = text.splitlines()
    assert lines[0] == "<!-- traceml-ci:report -->"
    assert "regression" in lines[1]
    assert "| mlp-short " in text and "❌ regression" in text
    assert "test\\_smoke.py::test\\_mlp" in text or "test_smoke.py::test_mlp" in text  # added
    assert "no baseline yet" in text
    assert "test_untraced" not in text


def test_require_baseline_fails_a_test_without_an_entry(smoke: SmokeProject) -> None:
    smoke.tests()
    # (three runs, the default: the entry's clean re-run must pass against it)
    smoke.run("--traceml-update-baseline", "-k", "test_mlp_short").assert_outcomes(passed=1)
    result = smoke.run("--traceml-require-baseline")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        f"traceml: no baseline for test_smoke.py::test_mlp in {smoke.baseline} "
        "(--traceml-require-baseline).",
        "Record one: run with --traceml-update-baseline.",
        "MISSING BASELINE *test_smoke.py::test_mlp  not in the baseline",
        "[PW]* *mlp-short*",
    ])


@pytest.mark.parametrize("where", ["pyproject", "ini"])
def test_settings_from_config_files(smoke: SmokeProject, where: str) -> None:
    smoke.tests()
    if where == "pyproject":
        smoke.pytester.makepyprojecttoml(
            '[tool.pytest.ini_options]\ntraceml_baseline = "gate/base.json"\n'
            "traceml_update_baseline = true\n\n"
            '[tool.traceml-ci.tolerances]\n"step_time.step_ms.median" = {rel = 200}\n'
        )
    else:
        smoke.pytester.makeini(
            "[pytest]\ntraceml_baseline = gate/base.json\ntraceml_update_baseline = true\n"
            f"traceml_tolerances = {smoke.tolerances.name}\n"
        )
    result = smoke.run("-k", "test_mlp_short", "--traceml-baseline-runs=1", gate=False)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "traceml: baseline */gate/base.json (no file yet, updating), rules: *",
        "UPDATED *mlp-short*",
    ])
    assert (smoke.path / "gate" / "base.json").is_file()
    rules = "pyproject.toml [[]tool.traceml-ci[]]" if where == "pyproject" else "tolerances.toml"
    assert rules.replace("[[]", "[").replace("[]]", "]") in result.stdout.str()
