"""gate/counted/input_pipeline.py through compare(): the input pipeline's ops per batch,
compared exactly;
a heavier augmentation regresses naming the op, its line and the Dataset's method, a lighter
one improves; not judged across batch sizes, num_workers 0 / > 0, or torch minor versions."""

from __future__ import annotations

import copy
from typing import Any

from tests.gate.summaries import make
from traceml_ci.gate.compare import Status, Verdict, compare

ROW = "counters.input_ops_per_batch"
S = 32  # samples per batch


def _part(kinds: dict[str, int], at: str) -> dict[str, Any]:
    return {"per_batch": sum(kinds.values()), "kinds": {k: [n, 0] for k, n in kinds.items()},
            "sites": [at], "allocs": 2, "alloc_bytes": 4096,
            "calls": {"user": S, "library": 290}}


FETCH = {"select": 3 * S, "slice": 2 * S, "sub": S, "div": S, "flip": 14}
COLLATE = {"empty": 2, "set_": 2, "resize_": 2, "stack": 2}
INPUT = {"batch": 2, "workers": 2, "samples": S, "dataset": "SyntheticImages.__getitem__",
         "fetch": _part(FETCH, "mlrepo/data.py:31"),
         "collate": _part(COLLATE, "torch/utils/data/_utils/collate.py:274")}


def _doc(block: dict[str, Any] | None = INPUT, torch_version: str = "2.13.0+cpu") -> dict:
    doc = make()
    doc["env"]["torch"] = torch_version
    doc["counters"] = {"sampled_step": 1}
    if block is not None:
        doc["counters"]["input"] = copy.deepcopy(block)
    return doc


def _heavy(**extra: Any) -> dict[str, Any]:
    block = copy.deepcopy(INPUT)
    block["fetch"] = _part({**FETCH, "convolution": S, "full": S}, "mlrepo/data.py:27")
    block.update(extra)
    return block


def test_the_same_pipeline_passes_quietly_and_an_absent_block_makes_no_row() -> None:
    row = compare(_doc(), _doc()).row(ROW)
    assert row.status is Status.OK and row.note == "" and row.base == row.head == 246
    assert all(r.name != ROW for r in compare(_doc(None), _doc()).rows)
    assert all(r.name != ROW for r in compare(_doc(), _doc(None)).rows)


def test_a_heavier_augmentation_regresses_per_sample_at_its_line() -> None:
    c = compare(_doc(), _doc(_heavy()))
    row = c.row(ROW)
    assert row.status is Status.REGRESSED and row.delta == 2 * S
    assert c.verdict is Verdict.REGRESSION
    assert row.cause == (
        "+64 ATen ops per batch in the input pipeline (+1 convolution per sample at "
        "mlrepo/data.py:27 in SyntheticImages.__getitem__; +1 full per sample at "
        "mlrepo/data.py:27 in SyntheticImages.__getitem__)")
    assert row.note.startswith(row.cause + ": heavier augmentation in the workers -- ")
    assert "Tuning Guide: enable async data loading and augmentation" in row.note
    assert row.cause in c.causes


def test_removing_it_improves() -> None:
    row = compare(_doc(_heavy()), _doc()).row(ROW)
    assert row.status is Status.IMPROVED
    assert row.note.startswith("-64 ATen ops per batch in the input pipeline (-1 convolution "
                               "per sample at mlrepo/data.py:27")


def test_a_heavier_collate_regresses_with_the_collate_advice() -> None:
    block = copy.deepcopy(INPUT)
    block["collate"] = _part({**COLLATE, "_local_scalar_dense": S, "lift_fresh": 1},
                             "mlrepo/data.py:41")
    row = compare(_doc(), _doc(block)).row(ROW)
    assert row.status is Status.REGRESSED
    assert "+1 _local_scalar_dense per sample at mlrepo/data.py:41 in collate_fn" in row.note
    assert ": a heavier collate_fn -- " in row.note


def test_not_judged_where_the_counts_measure_other_batches() -> None:
    bigger = _heavy(samples=2 * S)
    row = compare(_doc(), _doc(bigger)).row(ROW)
    assert row.status is Status.OK and row.note == f"not judged: batches of {S} → {2 * S} samples"
    row = compare(_doc(), _doc(_heavy(workers=0))).row(ROW)
    assert row.status is Status.OK and row.note.startswith("not judged: num_workers 2 → 0")
    one = compare(_doc(), _doc(_heavy(workers=1))).row(ROW)  # 1 or 2 workers: the same count
    assert one.status is Status.REGRESSED
    row = compare(_doc(), _doc(_heavy(), torch_version="2.14.0")).row(ROW)
    assert row.status is Status.OK and row.note == "not judged: torch 2.13 → 2.14"


def test_a_kind_whose_line_is_another_on_each_side_is_named_without_one() -> None:
    """``select`` runs at several lines; base names one, head (a line inserted above) another:
    which of them gained the ops the summary does not say, so no line is named for it."""
    base, head = copy.deepcopy(INPUT), copy.deepcopy(INPUT)
    base["fetch"] = {"per_batch": 3 * S, "kinds": {"select": [3 * S, 0]},
                     "sites": ["mlrepo/data.py:33"], "other": 0}
    head["fetch"] = {"per_batch": 5 * S, "kinds": {"select": [4 * S, 0], "convolution": [S, 1]},
                     "sites": ["mlrepo/data.py:34", "mlrepo/data.py:32"], "other": 0}
    row = compare(_doc(base), _doc(head)).row(ROW)
    assert row.cause == (
        "+64 ATen ops per batch in the input pipeline (+1 convolution per sample at "
        "mlrepo/data.py:32 in SyntheticImages.__getitem__; +1 select per sample in "
        "SyntheticImages.__getitem__)")


def test_a_collate_that_grew_among_the_kinds_not_listed_is_named_as_the_collate() -> None:
    def block(collate: int) -> dict:
        part = {"per_batch": 80, "kinds": {"copy_": [8, 0]}, "sites": ["data.py:9"], "other": 72}
        grown = dict(part, per_batch=collate, other=collate - 8)
        return {"batch": 2, "workers": 2, "samples": 8, "fetch": part, "collate": grown}

    base, head = make(), make()
    base["counters"] = {"sampled_step": 1, "input": block(80)}
    head["counters"] = {"sampled_step": 1, "input": block(280)}
    row = compare(base, head).row("counters.input_ops_per_batch")
    assert row.status is Status.REGRESSED and "a heavier collate_fn" in row.note
