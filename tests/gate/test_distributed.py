"""The gate on distributed summaries: a new straggler regresses, a different world size is
incomparable unless the rules allow it."""

from __future__ import annotations

from typing import Any

from tests.gate.summaries import make, shift
from traceml_ci.gate import DEFAULT_RULES, Verdict, compare
from traceml_ci.gate.rules import load_rules
from traceml_ci.summary.ranks import merge_ranks


def job(*rank_ms: dict[str, float]) -> dict[str, Any]:
    docs = []
    for r, ms in enumerate(rank_ms):
        doc = make(ms)
        doc["run"].update(rank=r, world_size=len(rank_ms))
        docs.append(doc)
    return merge_ranks(docs, world_size=len(rank_ms), backend="gloo")


BALANCED_2 = (shift(), shift(forward=0.1))


def test_the_same_balanced_job_passes() -> None:
    c = compare(job(*BALANCED_2), job(*BALANCED_2))
    assert c.verdict is Verdict.PASS
    assert c.row("distributed.straggler.label").status.value == "ok"


def test_a_new_input_straggler_is_a_regression_naming_the_label() -> None:
    head = job(shift(backward=6.0), shift(dataloader=6.0))  # rank 1 waits for data
    c = compare(job(*BALANCED_2), head)
    row = c.row("distributed.straggler.label")
    assert (row.base, row.head, row.status.value) == ("RANKS_BALANCED", "INPUT_STRAGGLER",
                                                      "regressed")
    assert c.verdict is Verdict.REGRESSION
    assert any("distributed.straggler" in r for r in c.reasons)


def test_a_straggler_that_got_worse_regresses_on_its_score() -> None:
    base = job(shift(backward=3.0), shift(dataloader=3.0))
    head = job(shift(backward=9.0), shift(dataloader=9.0))
    c = compare(base, head)
    assert c.row("distributed.straggler.label").status.value == "ok"  # same label
    assert c.row("distributed.straggler.score_pct").status.value == "regressed"


def test_a_different_world_size_is_incomparable_unless_allowed(tmp_path) -> None:
    two, four = job(*BALANCED_2), job(*BALANCED_2, shift(), shift())
    c = compare(two, four)
    assert c.verdict is Verdict.INCOMPARABLE
    assert any("world size 2 → 4" in r for r in c.reasons)
    rules = tmp_path / "rules.toml"
    rules.write_text("allow_world_size_change = true\n")
    allowed = compare(two, four, load_rules(rules))
    assert allowed.verdict is not Verdict.INCOMPARABLE


def test_single_process_summaries_have_no_distributed_rows() -> None:
    c = compare(make(), make(), DEFAULT_RULES)
    assert c.row("distributed.straggler.label") is None
