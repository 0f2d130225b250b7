"""The contention guard: a share shift on a contended CPU warns with a note; on quiet CPUs it
still fails. Summaries carry measured ``run.contention`` as the tracer writes it."""

from __future__ import annotations

import pytest

from tests.gate.summaries import make, shift
from traceml_ci.gate.compare import (
    CONTENDED_RUNQUEUE_WAIT_PCT,
    CONTENTION_MAX_SHIFT_PP,
    Status,
    Verdict,
    compare,
    contention_bound_pp,
)
from traceml_ci.summary.schema import summary_problems


def contended(doc: dict, wait: float | None) -> dict:
    doc["run"]["contention"] = {"runqueue_wait_pct": wait, "involuntary_switches_per_s": 40.0,
                                "load_per_cpu": 1.4, "cpu_steal_pct": 0.0}
    return doc


def test_a_summary_with_contention_validates():
    assert summary_problems(contended(make(), 23.0)) == []


def test_an_injected_8pp_shift_on_a_quiet_head_still_fails():
    base = contended(make(), 1.0)
    head = contended(make(shift(dataloader=2.2)), 0.5)  # +8 pp
    c = compare(base, head)
    assert c.row("step_time.dataloader_pct").status is Status.REGRESSED
    assert c.verdict is Verdict.REGRESSION


def test_the_same_shift_on_a_contended_head_warns_with_a_note():
    base = contended(make(), 1.0)
    head = contended(make(shift(dataloader=2.2)), 23.0)
    c = compare(base, head)
    row = c.row("step_time.dataloader_pct")
    assert row.status is Status.WARN
    assert row.note == "head ran on a contended CPU: runqueue wait 23 %"
    assert c.verdict is Verdict.WARN
    assert ("head ran on a contended CPU (runqueue wait 23 %): share shifts it can explain only "
            "warn") in c.notes


def test_a_contended_base_explains_a_shift_too():
    # Compute stretched in a loaded base lowers its dataloader share: a quiet head looks worse.
    c = compare(contended(make(), 30.0), contended(make(shift(dataloader=2.2)), 0.8))
    row = c.row("step_time.dataloader_pct")
    assert row.status is Status.WARN
    assert row.note == "base ran on a contended CPU: runqueue wait 30 %"


def test_both_loaded_warns_naming_both():
    c = compare(contended(make(), 15.0), contended(make(shift(dataloader=2.2)), 25.0))
    row = c.row("step_time.dataloader_pct")
    assert row.status is Status.WARN
    assert row.note == "both runs ran on contended CPUs: runqueue wait 15 % (base), 25 % (head)"


def test_a_shift_larger_than_the_contention_can_cause_still_fails():
    wait = 15.0  # a head share of 50 % can have been raised by at most 0.15 * 0.5 / 0.85 pp
    assert contention_bound_pp(30.0, 20.0, 50.0, 0.5, wait) == pytest.approx(100 * 0.075 / 0.85)
    c = compare(contended(make(), 0.5), contended(make(shift(dataloader=12.0)), wait))  # +30 pp
    assert c.row("step_time.dataloader_pct").status is Status.REGRESSED


def test_the_bound_follows_the_direction_and_the_side():
    # a rise: a contended head explains w(1 - s_head)/(1 - w), a contended base w s_base/(1 - w)
    assert contention_bound_pp(5.0, 20.0, 25.0, None, 10.0) == pytest.approx(10 * 0.75 / 0.9)
    assert contention_bound_pp(5.0, 20.0, 25.0, 10.0, None) == pytest.approx(10 * 0.20 / 0.9)
    # a fall: the other way round
    assert contention_bound_pp(-5.0, 25.0, 20.0, None, 10.0) == pytest.approx(10 * 0.20 / 0.9)
    assert contention_bound_pp(-5.0, 25.0, 20.0, 10.0, None) == pytest.approx(10 * 0.75 / 0.9)
    # quiet sides explain nothing; both contended: the sum
    assert contention_bound_pp(5.0, 20.0, 25.0, 9.9, 0.0) == 0.0
    assert contention_bound_pp(5.0, 10.0, 90.0, 10.0, 10.0) == pytest.approx(2 * 10 * 0.1 / 0.9)


def test_no_wait_excuses_more_than_the_cap():
    assert contention_bound_pp(30.0, 15.0, 45.0, 42.0, 57.0) == CONTENTION_MAX_SHIFT_PP
    # a tiny step on a heavily loaded runner: +26 pp still fails
    base = contended(make({"dataloader": 0.003, "forward": 0.007, "backward": 0.006,
                           "optimizer": 0.002, "other": 0.002}), 42.0)
    head = contended(make({"dataloader": 0.086, "forward": 0.07, "backward": 0.03,
                           "optimizer": 0.01, "other": 0.012}), 57.0)
    row = compare(base, head).row("step_time.dataloader_pct")
    assert row.delta > CONTENTION_MAX_SHIFT_PP and row.status is Status.REGRESSED


@pytest.mark.parametrize("wait", [None, CONTENDED_RUNQUEUE_WAIT_PCT - 0.1])
def test_below_the_threshold_or_unmeasured_is_quiet(wait):
    c = compare(make(), contended(make(shift(dataloader=2.2)), wait))
    assert c.row("step_time.dataloader_pct").status is Status.REGRESSED


def test_summaries_without_contention_are_judged_as_before():
    base, head = make(), make(shift(dataloader=2.2))
    assert "contention" not in base["run"]
    assert compare(base, head).verdict is Verdict.REGRESSION


def test_the_note_reaches_every_report_format():
    from traceml_ci.gate.render.comparison import render_json, render_markdown, render_text

    c = compare(contended(make(), 1.0), contended(make(shift(dataloader=2.2)), 23.0))
    for text in (render_text(c, width=200), render_markdown(c), render_json(c)):
        assert "head ran on a contended CPU: runqueue wait 23 %" in text
