"""A baseline, rules file or setting that cannot be used stops the session with a usage error
(exit code 4) naming the file -- not a wave of test failures. A summary that does not match the
schema fails its own test with the schema error."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.pytest_plugin.conftest import SmokeProject

#: A marked test that never imports torch: a usage error must stop the session before it runs.
CHEAP_TESTS = '''
import pytest


@pytest.mark.traceml
def test_never_runs():
    raise AssertionError("a usage error must stop the session before any test runs")
'''


def _set(summaries: dict[str, Any], version: str = "1.0") -> str:
    return json.dumps({"schema_version": version, "summaries": summaries})


def _invalid_summary(doc: dict[str, Any]) -> dict[str, Any]:
    bad = copy.deepcopy(doc)
    bad["step_time"]["forward_pct"] = "31"
    return bad


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{", "not valid JSON*"),
        ("", "file is empty"),
        ("[1, 2]", "not a baseline set*"),
        ('{"step_time": {}}', "not a baseline set*"),
        (_set({}, version="9.0"), "baseline set schema version 9.0 is newer*"),
        ("BAD-SUMMARY", 'summaries[[]"t"[]]: invalid summary: $.step_time.forward_pct: *'),
    ],
    ids=["not-json", "empty", "array", "a-summary", "newer-version", "invalid-entry"],
)
def test_unusable_baseline_is_a_usage_error_naming_the_file(
    smoke: SmokeProject, summary_doc: dict[str, Any], content: str, problem: str
) -> None:
    smoke.tests(CHEAP_TESTS)
    if content == "BAD-SUMMARY":
        content = _set({"t": _invalid_summary(summary_doc)})
    smoke.baseline.write_text(content)
    result = smoke.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: traceml: unusable baseline file {smoke.baseline}: "
                                 f"{problem}"])
    assert "test_never_runs" not in result.stdout.str()


def test_baseline_that_is_a_directory_is_a_usage_error(smoke: SmokeProject) -> None:
    smoke.tests(CHEAP_TESTS)
    smoke.baseline.mkdir()
    result = smoke.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: traceml: unusable baseline file {smoke.baseline}: *"])


def test_usage_error_exit_code_in_a_real_process(smoke: SmokeProject) -> None:
    smoke.tests(CHEAP_TESTS)
    smoke.baseline.write_text("not json")
    result = smoke.run(subprocess=True)
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"ERROR: traceml: unusable baseline file {smoke.baseline}: *"])
    assert "Traceback" not in result.stderr.str()


def test_invalid_tolerances_file_is_a_usage_error(smoke: SmokeProject) -> None:
    smoke.tests(CHEAP_TESTS)
    smoke.tolerances.write_text('[tolerances]\n"step_time.*_pct" = {abs = -1}\n')
    result = smoke.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: traceml: unusable tolerance rules: {smoke.tolerances}*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--traceml-repeats=0"], "--traceml-repeats must be at least 1, not 0"),
        (["--traceml-repeats=many"], "--traceml-repeats must be an integer, not 'many'"),
        (["--traceml-update-baseline"], "--traceml-update-baseline needs --traceml-baseline=PATH"),
        (["--traceml-require-baseline"],
         "--traceml-require-baseline needs --traceml-baseline=PATH"),
    ],
)
def test_bad_settings_are_usage_errors(smoke: SmokeProject, args: list[str], message: str) -> None:
    smoke.tests(CHEAP_TESTS)
    result = smoke.run(*args, gate=False)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


BROKEN_SUMMARY_TEST = '''
import pytest

from smoke_train import train
from traceml_ci.summary import model


@pytest.mark.traceml
def test_broken_summary(monkeypatch):
    real = model.Summary.to_dict

    def broken(self):
        doc = real(self)
        doc["step_time"]["forward_pct"] = str(doc["step_time"]["forward_pct"])
        doc["run"]["status"] = "exploded"
        return doc

    monkeypatch.setattr(model.Summary, "to_dict", broken)
    train()


@pytest.mark.traceml
def test_fine_after_it():
    train()
'''


def test_invalid_summary_fails_its_test_with_the_schema_error(smoke: SmokeProject) -> None:
    smoke.tests(BROKEN_SUMMARY_TEST)
    result = smoke.run("--traceml-update-baseline", "--traceml-baseline-runs=1")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "traceml: the summary for test_smoke.py::test_broken_summary does not match the "
        "final_summary.json schema:",
        "  $.run.status: 'exploded' is not one of *",
        "  $.step_time.forward_pct: '*' is not of type 'number'*",
        "INVALID SUMMARY *test_smoke.py::test_broken_summary  $.run.status: *",
        "UPDATED *test_smoke.py::test_fine_after_it  new entry*",
    ])
    assert sorted(smoke.baseline_summaries()) == ["test_smoke.py::test_fine_after_it"]


def test_report_to_an_unwritable_path_is_reported_and_exits_4(
    smoke: SmokeProject, tmp_path: Path
) -> None:
    smoke.tests(CHEAP_TESTS.replace("raise AssertionError(", "print(").replace(
        "@pytest.mark.traceml\n", ""))
    blocker = smoke.path / "file"
    blocker.write_text("")
    result = smoke.run(f"--traceml-save={blocker}/under/a/file.json", gate=False)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines([f"traceml: error: could not write {blocker}/under/a/file.json: *"])


def test_relative_paths_from_ini_folder_and_from_the_command_line(
    smoke: SmokeProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    smoke.tests(CHEAP_TESTS.replace("@pytest.mark.traceml\n", "").replace(
        "raise AssertionError(", "print("))
    smoke.pytester.makeini("[pytest]\ntraceml_baseline = gate/base.json\n")
    sub = smoke.path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    result = smoke.pytester.runpytest(
        "-p", "no:cacheprovider", "-p", "no:hypothesispytest", f"--rootdir={smoke.path}",
        "-c", str(smoke.path / "tox.ini"),
        "--traceml-save=out.json", str(smoke.path))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        f"traceml: baseline {smoke.path / 'gate' / 'base.json'} (no file yet), rules: defaults",
        f"traceml: summaries saved: {sub / 'out.json'} (0)",
    ])


def test_a_baseline_that_is_a_symlink_loop_is_a_usage_error(smoke: SmokeProject) -> None:
    """``baseline.json -> loop.json -> baseline.json``: pathlib's exists() answers False for a
    loop, so the session ran as with no baseline yet and exited 0, without a word."""
    smoke.tests(CHEAP_TESTS)
    loop = smoke.baseline.with_name("loop.json")
    smoke.baseline.unlink(missing_ok=True)
    smoke.baseline.symlink_to(loop.name)
    loop.symlink_to(smoke.baseline.name)
    result = smoke.run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR")]
    assert errors == [f"ERROR: traceml: unusable baseline file {smoke.baseline}: cannot read: "
                      "Too many levels of symbolic links"], result.stderr.lines
    assert "test_never_runs" not in result.stdout.str()
