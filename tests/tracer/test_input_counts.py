"""The input pipeline's work per batch (tracer/inputs.py), against analytic truths: a Dataset
whose ``__getitem__`` runs three known ops and makes two known storages, a collate with one op
and one storage; in the main process and in DataLoader workers (fork, and spawn), the same per
batch; the same block on every run; training untouched when the count fails or the user's
dataset raises; every patch put back."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load, marked_line
from traceml_ci.tracer import inputs


@pytest.fixture(autouse=True)
def _no_compile_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another test in this process may have compiled (which turns the step counters, where
    this block lives, off for the process): these tests run as a fresh process would."""
    from traceml_ci.tracer import flops

    monkeypatch.setattr(flops, "compile_in_use", lambda models=(), frames_before=0: False)

N, DIM, B = 64, 4, 8
HERE = os.path.relpath(__file__)
FORK = "fork" in torch.multiprocessing.get_all_start_methods()


def _at(marker: str) -> str:
    return f"{HERE}:{marked_line(__file__, 'marker:' + marker)}"


class Counted(Dataset):
    """Each sample: ``select`` (a view), ``mul`` and ``add`` (a new 16-byte storage each)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.base = torch.arange(N * DIM, dtype=torch.float32).view(N, DIM)
        self.fail_at = fail_at

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.fail_at:
            raise ValueError(f"bad sample {i}")
        x = self.base[i]  # marker:select
        y = x * 2  # marker:mul
        return y + 1  # marker:add


def stack(items: list[torch.Tensor]) -> torch.Tensor:
    """One op, one storage of the batch's bytes."""
    return torch.stack(items)  # marker:stack


def _loader(workers: int, collate: Any = stack, **kw: Any) -> DataLoader:
    return DataLoader(Counted(kw.pop("fail_at", None)), batch_size=B, num_workers=workers,
                      collate_fn=collate, **kw)


def _train(loader: DataLoader, steps: int = 6) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Linear(DIM, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    for i, x in enumerate(loader):
        seen.append(x)
        with traceml.trace_step(model):
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        if i + 1 >= steps:
            break
    return seen


def _input_block(fresh_tracer: Any, loader: DataLoader, steps: int = 6) -> dict[str, Any] | None:
    tracer = fresh_tracer(warmup_steps=2)
    _train(loader, steps)
    return finish_and_load(tracer)["counters"].get("input")


def _patched() -> list[Any]:
    from torch.utils.data import dataloader
    from torch.utils.data._utils import fetch, worker

    return [dataloader._SingleProcessDataLoaderIter.__dict__["__init__"],
            dataloader._MultiProcessingDataLoaderIter.__dict__["__init__"],
            dataloader._MultiProcessingDataLoaderIter.__dict__["_process_data"],
            worker.__dict__["_worker_loop"],
            fetch._MapDatasetFetcher.__dict__["fetch"],
            fetch._IterableDatasetFetcher.__dict__["fetch"]]


def _expected_fetch() -> dict[str, Any]:
    sites = [_at("add"), _at("mul"), _at("select")]  # kinds by count, then by name
    return {"per_batch": 3 * B, "kinds": {"add": [B, 0], "mul": [B, 1], "select": [B, 2]},
            "sites": sites, "allocs": 2 * B, "alloc_bytes": 2 * B * DIM * 4,
            "calls": {"user": B, "library": 2}}  # torch's fetch, its list comprehension


def test_the_main_process_counts_its_second_batch_exactly(fresh_tracer: Any) -> None:
    block = _input_block(fresh_tracer, _loader(0))
    assert block is not None
    assert {k: block[k] for k in ("batch", "workers", "samples", "dataset")} == {
        "batch": 2, "workers": 0, "samples": B, "dataset": "Counted.__getitem__"}
    assert block["fetch"] == _expected_fetch()
    assert block["collate"] == {"per_batch": 1, "kinds": {"stack": [1, 0]},
                                "sites": [_at("stack")], "allocs": 1,
                                "alloc_bytes": B * DIM * 4, "calls": {"user": 1, "library": 0}}


@pytest.mark.skipif(not FORK, reason="fork start method needed")
def test_workers_give_the_main_process_figures_per_batch(fresh_tracer: Any) -> None:
    main = _input_block(fresh_tracer, _loader(0))
    one = _input_block(fresh_tracer, _loader(1))
    two = _input_block(fresh_tracer, _loader(2))
    assert main is not None and one is not None and two is not None
    assert (one["workers"], two["workers"]) == (1, 2)
    for block in (one, two):
        assert {k: v for k, v in block.items() if k != "workers"} == {
            k: v for k, v in main.items() if k != "workers"}


@pytest.mark.skipif(not FORK, reason="fork start method needed")
def test_two_runs_give_the_same_block(fresh_tracer: Any) -> None:
    """torch's default collate in a worker (shared memory) and shuffled samples, twice."""
    runs = []
    for _ in range(2):
        loader = _loader(2, collate=None, shuffle=True,
                         generator=torch.Generator().manual_seed(1))
        runs.append(_input_block(fresh_tracer, loader))
    assert runs[0] is not None and runs[0] == runs[1]
    collate = runs[0]["collate"]
    # a worker's default collate: a shared-memory storage, a tensor on it, then stack into it
    assert set(collate["kinds"]) == {"empty", "set_", "resize_", "stack"}
    assert collate["per_batch"] == 4 and collate["allocs"] >= 1
    assert collate["alloc_bytes"] >= B * DIM * 4
    assert runs[0]["fetch"] == _expected_fetch()


def test_flops_and_the_kinds_not_listed(fresh_tracer: Any) -> None:
    """A (1×4)·(4×4) product per sample: 2·4·4 FLOPs; nine kinds per sample, eight listed."""

    class Many(Counted):
        w = torch.ones(DIM, DIM)

        def __getitem__(self, i: int) -> torch.Tensor:
            x = super().__getitem__(i)[None] @ self.w  # unsqueeze, mm
            return x.abs().neg().exp().sin()[0]  # four kinds, then select

    block = _input_block(fresh_tracer, DataLoader(Many(), batch_size=B, collate_fn=stack))
    assert block is not None
    fetch = block["fetch"]
    assert fetch["flops"] == B * 2 * DIM * DIM
    assert fetch["per_batch"] == 10 * B  # select twice
    assert len(fetch["kinds"]) == inputs.TOP_INPUT_KINDS == 8
    assert fetch["kinds"]["select"][0] == 2 * B and fetch["other"] == B


def test_python_calls_are_those_of_a_plain_fetch() -> None:
    """The calls the dispatch mode makes torch make (torch/_library, _ops.py) are left out:
    the count equals that of the same fetch with no mode on."""
    torch.set_num_threads(1)
    loader = _loader(0, collate=None)
    it = iter(loader)
    next(it)
    fetcher = it._dataset_fetcher
    index = list(range(B, 2 * B))
    count = inputs.BatchCount(inputs.Sites(), 0)
    count.run(fetcher, type(fetcher).fetch, index)
    block = count.block()
    assert block is not None

    calls = {"user": 0, "library": 0}
    sites = inputs.Sites()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            kind = sites.where(frame.f_code.co_filename)[0]
            if kind == inputs.USER:
                calls["user"] += 1
            elif kind != inputs.OWN:
                calls["library"] += 1

    sys.setprofile(profile)
    try:
        type(fetcher).fetch(fetcher, index)
    finally:
        sys.setprofile(None)
    got = block["fetch"]["calls"], block["collate"]["calls"]
    assert {k: got[0][k] + got[1][k] for k in calls} == calls


def test_the_counted_batch_is_the_batch_torch_makes(fresh_tracer: Any) -> None:
    """Same batches, same RNG stream after the loop, with the count and without."""

    class Noisy(Counted):
        def __getitem__(self, i: int) -> torch.Tensor:
            return super().__getitem__(i) + torch.rand(DIM)

    def batches() -> tuple[list[torch.Tensor], torch.Tensor]:
        loader = DataLoader(Noisy(), batch_size=B, collate_fn=stack)
        seen = _train(loader)
        return seen, torch.rand(3)

    plain, after_plain = batches()
    tracer = fresh_tracer(warmup_steps=2)
    traced, after_traced = batches()
    assert finish_and_load(tracer)["counters"]["input"]["fetch"]["per_batch"] == 5 * B
    assert all(torch.equal(a, b) for a, b in zip(plain, traced, strict=True))
    assert torch.equal(after_plain, after_traced)


@pytest.mark.skipif(not FORK, reason="fork start method needed")
def test_a_count_that_fails_in_a_worker_leaves_training_intact(
    fresh_tracer: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("our own bug")

    monkeypatch.setattr(inputs.BatchCount, "note_op", broken)  # forked workers inherit it
    expected = [torch.stack([Counted()[i] for i in range(s, s + B)]) for s in range(0, 6 * B, B)]
    tracer = fresh_tracer(warmup_steps=2)
    seen = _train(_loader(2))
    doc = finish_and_load(tracer)
    assert all(torch.equal(a, b) for a, b in zip(seen, expected, strict=True))
    assert "input" not in doc["counters"] and doc["run"]["status"] == "completed"
    assert "input pipeline not counted" in capfd.readouterr().err


@pytest.mark.skipif(not FORK, reason="fork start method needed")
@pytest.mark.parametrize(("workers", "fail_at"), [(0, 9), (2, 17)])
def test_the_users_own_error_reaches_the_user_as_it_would_untraced(
    fresh_tracer: Any, workers: int, fail_at: int
) -> None:
    """A sample of the counted batch (the main process's second, worker 0's second) raises."""
    before = _patched()
    tracer = fresh_tracer(warmup_steps=2)
    with pytest.raises(ValueError, match=f"bad sample {fail_at}"):
        _train(_loader(workers, fail_at=fail_at))
    tracer.finish()
    assert _patched() == before


@pytest.mark.skipif(not FORK, reason="fork start method needed")
def test_every_patch_is_put_back_and_no_report_folder_is_left(fresh_tracer: Any) -> None:
    before = _patched()
    tracer = fresh_tracer(warmup_steps=2)
    assert _patched() != before
    _train(_loader(2))
    folder = tracer.inputs._folder
    assert folder is not None and os.path.isdir(folder)
    finish_and_load(tracer)
    assert _patched() == before and not os.path.exists(folder)


def test_a_loader_with_one_batch_is_not_counted(fresh_tracer: Any) -> None:
    """No second batch: nothing to count, nothing said."""
    tracer = fresh_tracer(warmup_steps=2)
    _train(DataLoader(Counted(), batch_size=N, collate_fn=stack))
    _train(DataLoader(Counted(), batch_size=N, collate_fn=stack))  # a second epoch's iterator
    assert "input" not in finish_and_load(tracer)["counters"]


@pytest.mark.skipif(not FORK, reason="fork start method needed")
def test_the_first_iterator_counted_wins(fresh_tracer: Any) -> None:
    """A validation loader made while the training loader's count is awaited does not take its
    place: the first armed iterator's count is kept."""
    tracer = fresh_tracer(warmup_steps=2)
    train = iter(_loader(2))
    val = DataLoader(Counted(), batch_size=B, collate_fn=lambda items: torch.cat(items))
    next(train)
    list(val)  # counted at once (main process), but made after the training iterator
    _train(train)
    block = finish_and_load(tracer)["counters"]["input"]
    assert block["workers"] == 2 and "stack" in block["collate"]["kinds"]


def test_spawned_workers_are_counted_too(fresh_tracer: Any) -> None:
    block = _input_block(fresh_tracer, _loader(1, multiprocessing_context="spawn"))
    assert block is not None and block["fetch"] == _expected_fetch()


def test_the_report_is_written_whole(tmp_path: Path) -> None:
    path = inputs.report_path(str(tmp_path), 3)
    inputs._write_report(path, {"batch": 2})
    assert json.loads(Path(path).read_text()) == {"batch": 2}
    assert os.listdir(tmp_path) == ["input-3.json"]
