"""What an inconclusive A/B does to its test (``--traceml-ab-inconclusive``): by default it
passes with the estimate in the report and no warning; ``warn`` adds a pytest warning; ``fail``
fails it. Real pytest sessions of the plugin in a real git repository; each round's two sides
are measured by a conftest that stands in for the child sessions with device-clock figures
too noisy to decide (only a device clock's timings can be inconclusive: a host clock's inform,
tests/pytest_plugin/test_ab.py)."""

from __future__ import annotations

import json

import pytest

from tests.abrepo import commit

CONFTEST = """
import pytest_plugin.ab as ab
from traceml_ci.gate.ab.sequential import Side, SideFigures

SHARES = {"dataloader": 10.0, "forward": 40.0, "backward": 35.0, "optimizer": 10.0,
          "other": 5.0}


def measure(self, side, number):
    # no summary: device-clock figures, the head 40 % slower one round and 40 % faster the next
    self.key = self.key or self.preferred_key
    if side is Side.BASE:
        return SideFigures(10.0, SHARES)
    return SideFigures(14.0 if number % 2 else 7.0, SHARES)


ab.RoundRunner.measure = measure
"""

TESTS = """
import pytest


@pytest.mark.traceml(warmup_steps=0)
def test_train():
    pass
"""


@pytest.fixture
def repo(pytester: pytest.Pytester):
    commit(pytester.path, "base", {"conftest.py": CONFTEST, "test_smoke.py": TESTS})
    commit(pytester.path, "head", {"README": "the head\n"})
    return pytester


def _run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict]:
    # (without hypothesis's plugin: each in-process session would import hypothesis afresh,
    # pytester dropping what a session imported, most of a second)
    result = pytester.runpytest_inprocess("--traceml-ab=HEAD~1", "--traceml-ab-rounds-max=4",
                                          "--traceml-ab-json=ab.json", "-W", "default",
                                          "-p", "no:hypothesispytest", *args)
    return result, json.loads((pytester.path / "ab.json").read_text())


def test_by_default_an_inconclusive_test_passes_without_a_warning(repo) -> None:
    result, doc = _run(repo)
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    [test] = doc["tests"]
    assert test["verdict"] == "inconclusive" and not test["enforced"]
    assert test["detail"].startswith("inconclusive after 4 rounds: step time ")
    assert "(95% interval" in test["detail"]  # the estimate and its interval
    assert "warnings summary" not in result.stdout.str()
    assert "PytestWarning" not in result.stdout.str()


def test_warn_adds_a_pytest_warning(repo) -> None:
    result, _ = _run(repo, "--traceml-ab-inconclusive=warn")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*PytestWarning: traceml: A/B inconclusive after 4 rounds: *"])


def test_fail_fails_the_test_saying_inconclusive(repo) -> None:
    result, doc = _run(repo, "--traceml-ab-inconclusive=fail")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*traceml: A/B inconclusive for test_smoke.py::test_train*"])
    assert doc["tests"][0]["enforced"]
