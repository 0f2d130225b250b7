"""Fast unit tests of the plugin's pure parts: median run, results, terminal lines."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pytest_plugin.results import GateResult, Outcome
from pytest_plugin.terminal import result_lines


def _with_step(doc: dict[str, Any], ms: float | None, tag: str) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    d["step_time"]["step_ms"]["median"] = ms
    d["run"]["name"] = tag
    return d


@pytest.mark.parametrize(
    ("steps", "picked"),
    [
        ([5.0], "0"),
        ([9.0, 3.0, 4.0], "2"),  # the middle step time, not the fastest
        ([4.0, 30.0, 3.0, 5.0], "0"),  # even count: the lower middle
        ([4.0, None, 3.0], "0"),  # no step time sorts last
        ([4.0, 4.0, 4.0], "1"),  # ties: in run order
    ],
)
def test_repeats_combine_on_the_middle_run_by_step_time(
    summary_doc: dict[str, Any], steps: list[float | None], picked: str
) -> None:
    # What the plugin gates for --traceml-repeats: labels and run info come from this run.
    from traceml_ci.summary.repeats import combine_repeats

    docs = [_with_step(summary_doc, ms, str(i)) for i, ms in enumerate(steps)]
    assert combine_repeats(docs)["run"]["name"] == picked


def test_result_round_trips_through_plain_data(summary_doc: dict[str, Any]) -> None:
    r = GateResult("t.py::a", "k", Outcome.NO_BASELINE, "note", summary_doc, 3)
    assert GateResult.from_dict(r.to_dict()) == r


def test_which_outcomes_fail_a_test() -> None:
    assert {o for o in Outcome if o.fails} == {
        Outcome.REGRESSION, Outcome.INCOMPARABLE, Outcome.MISSING, Outcome.INVALID}


def test_terminal_lines_are_sorted_aligned_and_marked_up() -> None:
    results = [
        GateResult("t.py::b", "t.py::b", Outcome.REGRESSION, "step_time.diagnosis: A → B"),
        GateResult("t.py::a", "short", Outcome.PASS, "COMPUTE_BOUND, step 3 ms", repeats=3),
        GateResult("t.py::c", "t.py::c", Outcome.NOT_GATED),
    ]
    lines = result_lines(results)
    assert [text for text, _ in lines] == [
        "PASS              t.py::a [key short] (×3 runs)  COMPUTE_BOUND, step 3 ms",
        "REGRESSION        t.py::b  step_time.diagnosis: A → B",
        "RECORDED          t.py::c",
    ]
    assert lines[1][1] == {"red": True, "bold": True}


def test_every_gate_verdict_has_an_outcome_and_an_action_verdict() -> None:
    # The front doors restate the gate's verdicts (they add states of their own): keep in step.
    from pytest_plugin.results import Outcome
    from traceml_ci.gate import Verdict
    from traceml_ci.github.gate_step import Verdict as ActionVerdict

    for verdict in Verdict:
        assert Outcome(verdict.value).value == verdict.value
        assert ActionVerdict(verdict.value).value == verdict.value
