"""The PR comment's headline names the straggler: which rank, in which phase, by how much, and
who waits for it (gate/causes.py's straggler_change), from merged summaries made by
summary/ranks.py's own merge of handmade rank summaries."""

from __future__ import annotations

from typing import Any

from tests.gate.summaries import make, shift
from traceml_ci.gate import compare
from traceml_ci.gate.causes import known_causes, straggler_change
from traceml_ci.gate.render.comparison import render_markdown, render_text
from traceml_ci.summary.ranks import merge_ranks

#: A rank's step under a process group: its own work and the time it waits for the others.
RANK_MS = {**shift(), "wait": 0.5}


def job(*rank_ms: dict[str, float]) -> dict[str, Any]:
    docs = []
    for r, ms in enumerate(rank_ms):
        doc = make(ms, name="ddp")
        doc["run"].update(rank=r, local_rank=r, node_rank=0, host="node-a",
                          world_size=len(rank_ms))
        docs.append(doc)
    return merge_ranks(docs, world_size=len(rank_ms), nodes=1, backend="gloo")


def balanced(n: int) -> dict[str, Any]:
    return job(*(shift(RANK_MS, forward=0.05 * r) for r in range(n)))


def slow(n: int, rank: int, phase: str, ms: float = 6.0) -> dict[str, Any]:
    """``n`` ranks, ``rank`` ``ms`` slower in ``phase``; the others wait that much longer."""
    return job(*(
        shift(RANK_MS, **{phase: ms}) if r == rank else shift(RANK_MS, wait=ms)
        for r in range(n)
    ))


def test_a_new_backward_straggler_is_the_headline_cause() -> None:
    base, head = balanced(2), slow(2, 1, "backward")
    s = head["distributed"]["straggler"]
    assert (s["label"], s["rank"], s["cause"]) == ("COMPUTE_STRAGGLER", 1, "backward")
    said = ("rank 1 straggles in backward (+6.0 ms per step over the other ranks), "
            f"rank 0 waits {s['lateness_ms']:.1f} ms per step for it")
    assert s["lateness_ms"] >= 6.0 - 0.01
    c = compare(base, head)
    assert said in c.causes
    md = render_markdown(c).splitlines()
    # marker, the verdict, a blank line, then the cause, before any table
    assert md[3] == f"**Cause:** {said}"
    text = render_text(c, width=200).splitlines()
    assert text[1] == f"cause: {said}"


def test_each_phase_is_named_with_its_rank() -> None:
    for phase in ("dataloader", "forward", "backward", "optimizer", "other"):
        said = straggler_change(balanced(2), slow(2, 0, phase, ms=9.0))
        assert said.startswith(f"rank 0 straggles in {phase} (+9.0 ms per step"), said
        assert said.endswith("rank 1 waits 9.0 ms per step for it"), said


def test_several_ranks_wait_named_or_counted() -> None:
    assert ", ranks 0, 1, 3 wait " in straggler_change(balanced(4), slow(4, 2, "forward"))
    assert ", the other 5 ranks wait " in straggler_change(balanced(6), slow(6, 5, "forward"))


def test_the_same_straggler_on_both_sides_is_no_cause() -> None:
    assert straggler_change(slow(2, 1, "forward"), slow(2, 1, "forward", ms=8.0)) == ""
    assert known_causes(slow(2, 1, "forward"), slow(2, 1, "forward", ms=8.0), []) == []


def test_another_rank_or_phase_is_named() -> None:
    base = slow(2, 1, "forward")
    assert straggler_change(base, slow(2, 0, "forward")).startswith("rank 0 straggles in forward")
    assert straggler_change(base, slow(2, 1, "backward")).startswith(
        "rank 1 straggles in backward")


def test_a_straggler_gone_or_single_process_names_nothing() -> None:
    assert balanced(2)["distributed"]["straggler"]["label"] == "RANKS_BALANCED"
    assert straggler_change(slow(2, 1, "backward"), balanced(2)) == ""
    assert straggler_change(make(), make(shift(backward=6.0))) == ""
    assert straggler_change(balanced(2), balanced(2)) == ""


def test_without_the_wait_phase_the_waiting_ranks_are_named_without_a_figure() -> None:
    old = job(shift(backward=6.0), shift(dataloader=6.0))  # rank 0 waits inside backward
    assert old["distributed"]["straggler"]["evidence"] == "own_work"
    said = straggler_change(job(shift(), shift()), old)
    assert said == ("rank 1 straggles in dataloader (+6.0 ms per step over the other ranks), "
                    "rank 0 waits for it")


def test_each_ranks_wait_splits_into_transfer_and_waiting_for_the_others() -> None:
    """The least any rank waits is the collectives' own time (the last to arrive waits for no
    one); the rest of each rank's wait is waiting for the straggler."""
    head = slow(3, 2, "forward", ms=6.0)
    block = head["distributed"]
    assert block["transfer_ms"] == RANK_MS["wait"]
    waiting = {r["rank"]: r["waiting_ms"] for r in block["ranks"]}
    assert waiting == {0: 6.0, 1: 6.0, 2: 0.0}
    text = render_text(compare(balanced(3), head), width=400)
    assert "collectives take 0.50 ms per step without waiting" in text


def test_a_changed_headline_rank_is_said_when_comparing() -> None:
    """Base's split is rank 0's, head's rank 1's (it straggles): the report says the shares
    compare two ranks; the same rank on both sides says nothing."""
    base, head = slow(2, 0, "forward"), slow(2, 1, "forward")
    assert (base["distributed"]["headline_rank"], head["distributed"]["headline_rank"]) == (0, 1)
    said = [n for n in compare(base, head).notes if "rank 0's in base and rank 1's in head" in n]
    assert len(said) == 1, compare(base, head).notes
    assert not [n for n in compare(head, head).notes if "in base and rank" in n]
