"""The ``traceml`` fixture and the marker's arguments, in real sessions."""

from __future__ import annotations

from tests.pytest_plugin.conftest import SmokeProject

FIXTURE_TESTS = '''
import pytest

import traceml_ci
from traceml_ci.tracer import api
from smoke_train import train


@pytest.mark.traceml(max_steps=30, warmup_steps=4)
def test_live_tracer_and_early_finish(traceml):
    assert traceml.tracer is not None and traceml.tracer is api.current()
    assert traceml.summary is None
    train()
    summary = traceml.finish()
    assert traceml.summary is summary
    st = summary["step_time"]
    assert (st["steps_total"], st["warmup_steps"], st["steps_analyzed"]) == (30, 4, 26)
    # diagnosed (26 analysed steps); which label is the machine's load's business here
    assert st["diagnosis"] not in (None, "INSUFFICIENT_DATA")
    assert summary["run"]["name"] == traceml.key
    assert traceml.key == "test_smoke.py::test_live_tracer_and_early_finish"


def test_tracer_is_gone_after_a_traced_test(traceml):
    assert api.current() is None
    assert traceml.tracer is None


def test_finish_needs_the_marker(traceml):
    traceml.finish()


@pytest.mark.traceml
def test_own_failure_is_not_gated():
    train(12)
    assert False, "the test's own failure"


@pytest.mark.traceml(steps=3)
def test_unknown_marker_argument():
    pass


@pytest.mark.traceml("positional")
def test_positional_marker_argument():
    pass


@pytest.mark.traceml(max_steps=0)
def test_bad_max_steps():
    pass


@pytest.mark.traceml(key="same")
def test_key_first():
    train(12)


@pytest.mark.traceml(key="same")
def test_key_second():
    train(12)


def test_missing_script(traceml):
    traceml.run_script("no_such_script.py")


@pytest.mark.traceml
def test_script_in_a_marked_test_needs_a_key(traceml):
    traceml.run_script(__file__)
'''


def test_fixture_and_marker_in_one_session(smoke: SmokeProject) -> None:
    smoke.tests(FIXTURE_TESTS)
    result = smoke.run()
    result.assert_outcomes(passed=3, failed=8)
    result.stdout.fnmatch_lines([
        "*_ test_finish_needs_the_marker _*",
        "traceml.finish() needs a test marked @pytest.mark.traceml",
        "*_ test_own_failure_is_not_gated _*",
        "E       AssertionError: the test's own failure",
        "*_ test_unknown_marker_argument _*",
        "@pytest.mark.traceml: unknown argument(s) steps; expected some of key, max_steps, mode, "
        "warmup_steps",
        "*_ test_positional_marker_argument _*",
        "@pytest.mark.traceml takes keyword arguments only (warmup_steps, max_steps, key, mode)",
        "*_ test_bad_max_steps _*",
        "@pytest.mark.traceml: max_steps must be an integer >= 1, not 0",
        "*_ test_key_second _*",
        "traceml: baseline key 'same' is already used by test_smoke.py::test_key_first; give "
        "this summary its own key (@pytest.mark.traceml(key=...) or run_script(key=...))",
        "*_ test_missing_script _*",
        f"traceml.run_script(): no such script no_such_script.py (looked in {smoke.path})",
        "*_ test_script_in_a_marked_test_needs_a_key _*",
        "traceml.run_script() in a @pytest.mark.traceml test needs its own key= (the test's key "
        "gates the test's own tracer)",
        "*- traceml -*",
    ])
    assert "During handling" not in result.stdout.str()
    section = result.stdout.str().split("- traceml -")[1].split("short test summary")[0]
    assert "test_own_failure_is_not_gated" not in section  # a failing body is not gated
    assert "test_key_first [key same]" in section and "test_key_second" not in section
