"""Installed but unused, the plugin is inert: no output, no heavy imports, nothing written."""

from __future__ import annotations

import subprocess
import sys

import pytest

PLAIN_TESTS = '''
def test_one():
    assert 1


def test_two():
    assert 2
'''

RECORD_MODULES = '''
import sys


def pytest_sessionfinish(session):
    heavy = ("torch", "traceml_ci.tracer", "traceml_ci.gate", "jsonschema", "rich",
             "pytest_plugin.state", "pytest_plugin.runner")
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "jsonschema", "rich"}
                    or m.startswith(heavy))
    with open("modules.txt", "w") as fh:
        fh.write("\\n".join(loaded))
'''


def test_session_without_traced_tests_imports_nothing_heavy(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(PLAIN_TESTS)
    pytester.makeconftest(RECORD_MODULES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
    result.assert_outcomes(passed=2)
    assert "traceml" not in result.stdout.str().replace("traceml-ci-", "")
    assert (pytester.path / "modules.txt").read_text() == ""
    pytester_own = {"stdout", "stderr", "runpytest-0", "runpytest-current"}
    assert sorted(p.name for p in pytester.path.iterdir() if p.name not in pytester_own) == [
        "conftest.py", "modules.txt", "test_session_without_traced_tests_imports_nothing_heavy.py"]


def test_importing_the_front_door_is_light() -> None:
    code = ("import sys, pytest_plugin.plugin; "
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'traceml_ci', "
            "'jsonschema', 'rich'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_plugin_can_be_disabled(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(PLAIN_TESTS)
    result = pytester.runpytest("-p", "no:traceml", "--traceml-baseline=x.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unrecognized arguments: --traceml-baseline=x.json*"])
