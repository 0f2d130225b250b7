"""The gate compares the h2d phase like the other phases where both sides have it; where only
the head has it (a baseline from before the phase, or one that copied nothing) it is new, and
fails nothing."""

from __future__ import annotations

from tests.summary.builders import summary_doc
from traceml_ci.gate.compare import compare
from traceml_ci.gate.render.comparison import render_markdown
from traceml_ci.gate.results import Status, Verdict

OWN = {"dataloader": 1.0, "forward": 4.0, "backward": 4.0, "optimizer": 1.0}


def test_slower_copies_regress_the_h2d_share() -> None:
    base = summary_doc({**OWN, "h2d": 0.5}, copies=True, jitter=0.02)
    head = summary_doc({**OWN, "h2d": 8.0}, copies=True, jitter=0.02)  # pageable memory, say
    c = compare(base, head)
    row = c.row("step_time.h2d_pct")
    assert row is not None and row.status is Status.REGRESSED
    assert c.row("step_time.phase_ms.h2d") is not None
    assert c.verdict is Verdict.REGRESSION
    assert "h2d" in render_markdown(c)


def test_a_head_that_starts_copying_has_a_new_h2d_row_that_fails_nothing() -> None:
    base = summary_doc(OWN, jitter=0.02)
    head = summary_doc({**OWN, "h2d": 0.5}, copies=True, jitter=0.02)
    c = compare(base, head)
    row = c.row("step_time.h2d_pct")
    assert row is not None and row.status is Status.NEW and row.base is None
    assert c.verdict is Verdict.PASS
