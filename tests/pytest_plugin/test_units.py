"""Fast unit tests of the plugin's pure parts: median run, results, terminal lines."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pytest_plugin.results import GateResult, Handling
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


def _compared(doc: dict[str, Any], dataloader_pp: float = 0.0) -> Any:
    """A real comparison of ``doc`` with itself, its dataloader share moved by ``dataloader_pp``."""
    from traceml_ci.gate import compare

    head = copy.deepcopy(doc)
    st = head["step_time"]
    st["dataloader_pct"] += dataloader_pp
    st["forward_pct"] -= dataloader_pp
    return compare(doc, head)


def test_result_round_trips_through_plain_data(summary_doc: dict[str, Any]) -> None:
    r = GateResult("t.py::a", "k", Handling.NO_BASELINE, "note", summary_doc, 3)
    assert GateResult.from_dict(r.to_dict()) == r
    compared = GateResult("t.py::a", "k", Handling.COMPARED, "", summary_doc, 1,
                          _compared(summary_doc, 30.0))
    back = GateResult.from_dict(compared.to_dict())
    assert back == compared and back.verdict is compared.verdict  # the same comparison
    from dataclasses import replace

    from traceml_ci.gate.render.ops import ProfiledRun
    from traceml_ci.summary.profile import top_ops

    top = top_ops([("aten::mm", 3.0, None, 2)], steps=1, device="cpu")
    profiled = replace(compared, profile=ProfiledRun("k", top, top, "/t.json", 1.5, 10),
                       profile_error="")
    assert GateResult.from_dict(profiled.to_dict()) == profiled  # xdist: a worker's profile
    failed = replace(compared, profile_error="the profiled run failed: boom")
    assert GateResult.from_dict(failed.to_dict()).profile_error == failed.profile_error


def test_what_fails_a_test(summary_doc: dict[str, Any]) -> None:
    from traceml_ci.gate import Verdict

    regressed = _compared(summary_doc, 30.0)
    assert regressed.verdict is Verdict.REGRESSION
    same = _compared(summary_doc)
    assert same.verdict is Verdict.PASS

    def result(handling: Handling, comparison: Any = None, enforced: bool = True) -> GateResult:
        return GateResult("t.py::a", "k", handling, comparison=comparison, enforced=enforced)

    assert result(Handling.COMPARED, regressed).fails
    assert not result(Handling.COMPARED, regressed, enforced=False).fails  # --traceml-report-only
    assert not result(Handling.COMPARED, same).fails
    assert not result(Handling.UPDATED, regressed).fails  # accepted: "was regression"
    assert {h for h in Handling if result(h).fails} == {Handling.MISSING, Handling.INVALID}
    # The word shown is the gate's verdict when there is one, else the handling.
    assert result(Handling.COMPARED, regressed).label == "regression"
    assert result(Handling.UPDATED, regressed).label == "updated"


def test_terminal_lines_are_sorted_aligned_and_marked_up(summary_doc: dict[str, Any]) -> None:
    results = [
        GateResult("t.py::b", "t.py::b", Handling.COMPARED, "step_time.diagnosis: A → B",
                   comparison=_compared(summary_doc, 30.0)),
        GateResult("t.py::a", "short", Handling.COMPARED, "COMPUTE_BOUND, step 3 ms",
                   repeats=3, comparison=_compared(summary_doc)),
        GateResult("t.py::c", "t.py::c", Handling.NOT_GATED),
    ]
    lines = result_lines(results)
    assert [text for text, _ in lines] == [
        "PASS              t.py::a [key short] (×3 runs)  COMPUTE_BOUND, step 3 ms",
        "REGRESSION        t.py::b  step_time.diagnosis: A → B",
        "RECORDED          t.py::c",
    ]
    assert lines[1][1] == {"red": True, "bold": True}
