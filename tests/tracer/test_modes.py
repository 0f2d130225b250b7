"""Manual mode, zero-change mode, warmup, init() precedence, and degrading on internal errors.

Which phase each mode gives time to is the tracer's rule: the loops spend fake time
(``fakes.FakeClock``) and the per-step phases are checked exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import dataloader as dl_mod

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load, pct
from tests.tracer.fakes import FakeClock
from tests.tracer.loops import BusyModel, BusySGD, busy_job, busy_loader, spend_on, train
from traceml_ci.tracer import api
from traceml_ci.tracer.steps import PHASE_COLS


def phase_columns(tracer: Any,
                  phases: tuple[str, ...] = ("dataloader", "forward", "backward", "optimizer"),
                  ) -> dict[str, list[float]]:
    """The tracer's per-step ms of each phase over the analysed steps."""
    return {p: tracer.store.column(PHASE_COLS[p]) for p in phases}


def test_manual_mode_patches_nothing_and_marks_phases_by_hand(fresh_tracer) -> None:
    original_backward = torch.autograd.backward
    original_next = dl_mod._BaseDataLoaderIter.__next__
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(mode="manual", warmup_steps=1, clock=clock)
    assert torch.autograd.backward is original_backward
    assert dl_mod._BaseDataLoaderIter.__next__ is original_next
    model = BusyModel(2.0, 1.0, spend=spend)
    optimizer = BusySGD(model.parameters(), 0.5, spend=spend)
    batches = traceml.wrap_dataloader(busy_loader(12, 3.0, spend=spend))
    for _ in range(12):
        x, y = next(batches)
        with traceml.trace_step(model):
            optimizer.zero_grad()
            with traceml.phase("forward"):
                out = model(x)
            loss = ((out - y) ** 2).mean()
            spend(0.25)  # outside every marked phase: other
            with traceml.phase("backward"):
                loss.backward()
            with traceml.phase("optimizer"):
                optimizer.step()
    assert "forward" not in model.__dict__  # manual: the model is never wrapped
    doc = finish_and_load(tracer)
    assert doc["step_time"]["phase_ms"] == {"dataloader": 3.0, "forward": 2.0, "backward": 1.0,
                                            "optimizer": 0.5, "other": 0.25}
    assert doc["step_time"]["steps_total"] == 12
    assert doc["step_time"]["throughput"]["batch_size"] == 4


def test_phase_rejects_unknown_names(fresh_tracer) -> None:
    fresh_tracer(mode="manual")
    with pytest.raises(ValueError, match="phase must be one of"):
        traceml.phase("loss")


def test_zero_change_mode_delimits_steps_by_optimizer_steps(fresh_tracer) -> None:
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(zero_change=True, warmup_steps=2, clock=clock)
    model = BusyModel(2.0, 1.5, spend=spend)
    optimizer = BusySGD(model.parameters(), 1.0, spend=spend)
    criterion = torch.nn.MSELoss()  # a parameter-free module: not a "model" root
    batches = iter(busy_loader(16, 3.0, spend=spend))
    for _ in range(16):
        x, y = next(batches)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    doc = finish_and_load(tracer)
    st = doc["step_time"]
    assert doc["run"]["mode"] == "zero-change"
    assert st["steps_total"] == 16
    assert st["steps_analyzed"] == 14
    assert tracer.roots.timed == [model]  # the loss module has no parameters: not a model
    # Step 1 discovers the model with global hooks (warmup); from step 2 its forward is timed.
    assert phase_columns(tracer) == {"dataloader": [3.0] * 14, "forward": [2.0] * 14,
                                     "backward": [1.5] * 14, "optimizer": [1.0] * 14}


def test_zero_change_gradient_accumulation_is_one_step_per_optimizer_step(fresh_tracer) -> None:
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(zero_change=True, warmup_steps=0, clock=clock)
    model = BusyModel(0.5, 0.25, spend=spend)
    optimizer = BusySGD(model.parameters(), 1.0, spend=spend)
    for i, (x, y) in enumerate(busy_loader(24, 0.75, spend=spend)):
        ((model(x) - y) ** 2).mean().backward()
        if i % 3 == 2:
            optimizer.step()
            optimizer.zero_grad()
    doc = finish_and_load(tracer)
    assert doc["step_time"]["steps_total"] == 8
    # Each step holds its three micro-batches (the first step's model is found in it).
    assert {p: col[1:] for p, col in phase_columns(tracer).items()} == {
        "dataloader": [2.25] * 7, "forward": [1.5] * 7, "backward": [0.75] * 7,
        "optimizer": [1.0] * 7}


def test_trace_step_takes_over_from_zero_change_mode(fresh_tracer) -> None:
    clock = FakeClock()
    tracer = fresh_tracer(zero_change=True, warmup_steps=0, clock=clock)
    busy_job(10, 0.5, spend_on(clock))
    doc = finish_and_load(tracer)
    assert doc["run"]["mode"] == "auto"
    assert doc["step_time"]["steps_total"] == 10


def test_warmup_steps_are_counted_but_not_analysed(fresh_tracer) -> None:
    clock = FakeClock()
    tracer = fresh_tracer(warmup_steps=7, clock=clock)
    busy_job(20, 0.2, spend_on(clock))
    st = finish_and_load(tracer)["step_time"]
    assert (st["steps_total"], st["warmup_steps"], st["steps_analyzed"]) == (20, 7, 13)


def test_too_few_steps_is_insufficient_data_with_null_percentages(fresh_tracer) -> None:
    clock = FakeClock()
    tracer = fresh_tracer(warmup_steps=5, clock=clock)
    busy_job(4, 0.1, spend_on(clock))
    st = finish_and_load(tracer)["step_time"]
    assert st["diagnosis"] == "INSUFFICIENT_DATA"
    assert st["steps_analyzed"] == 0
    assert st["dataloader_pct"] is None and st["noise"] is None


def test_init_twice_reconfigures_but_respects_launcher_locks(tmp_path, fresh_tracer) -> None:
    from traceml_ci.tracer.config import TracerConfig

    tracer = api.start(
        TracerConfig(out_dir=tmp_path / "cli-out", warmup_steps=3, locked=frozenset({"out_dir"})),
        at_exit=False,
    )
    same = traceml.init(
        mode="auto", out_dir=tmp_path / "script-out", run_name="mine", warmup_steps=1
    )
    assert same is tracer
    assert tracer.config.out_dir == tmp_path / "cli-out"  # locked by the launcher
    assert tracer.config.run_name == "mine"
    assert tracer.store.warmup_steps == 1
    api.stop()


def test_out_dir_defaults_to_env_var(tmp_path, monkeypatch, torch_single_thread) -> None:
    monkeypatch.setenv("TRACEML_CI_OUT", str(tmp_path / "from-env"))
    api.stop()
    tracer = traceml.init(mode="manual")
    try:
        with traceml.trace_step():
            pass
        path = traceml.finish()
        assert path == tmp_path / "from-env" / "final_summary.json"
        assert path.is_file()
    finally:
        api.stop()
        tracer.patches.uninstall()


def test_internal_error_warns_once_stops_tracing_and_training_goes_on(fresh_tracer, capfd) -> None:
    clock = FakeClock()
    tracer = fresh_tracer(warmup_steps=0, clock=clock)
    model = BusyModel(0.1, 0.1, spend=spend_on(clock))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = {"n": 0}
    real_mark = tracer.rec.mark

    def flaky_mark():
        calls["n"] += 1
        if calls["n"] > 20:
            raise RuntimeError("clock broke")
        return real_mark()

    tracer.rec.mark = flaky_mark
    before = [p.detach().clone() for p in model.parameters()]
    steps = train(busy_loader(15, 0.1, spend=spend_on(clock)), model, optimizer,
                  traceml.trace_step, 15)
    assert steps == 15  # the loop never saw an exception
    assert any((a != b).any() for a, b in zip(before, model.parameters(), strict=True))
    err = capfd.readouterr().err
    assert err.count("traceml-ci: warning: tracing stopped") == 1
    assert not tracer.enabled
    assert torch.autograd.backward.__name__ == "backward"
    assert not hasattr(torch.autograd.backward, "__wrapped__")
    assert "forward" not in model.__dict__
    assert tracer.finish() is not None  # what was recorded before the failure is kept


@pytest.mark.parametrize("epochs", [1, 2])
def test_an_internal_error_at_a_loaders_end_leaves_the_loop_its_stop_iteration(
    fresh_tracer, capfd, monkeypatch, epochs: int
) -> None:
    """The tracer's bookkeeping when a loader runs out (the fast path's and, for a new
    iterator's first fetch, the general one's) fails: the loop still ends as it would have,
    every epoch runs, and the tracer warns once."""
    from traceml_ci.tracer.recorder import Recorder

    def broken(self, *args):
        raise RuntimeError("bookkeeping broke")

    monkeypatch.setattr(Recorder, "_loop_ended", broken)
    clock = FakeClock()
    fresh_tracer(warmup_steps=0, clock=clock)
    model = BusyModel(0.1, 0.1, spend=spend_on(clock))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = busy_loader(4, 0.1, spend=spend_on(clock))
    steps = sum(train(loader, model, optimizer, traceml.trace_step, 100) for _ in range(epochs))
    assert steps == 4 * epochs  # each epoch ended on its loader's StopIteration, no other
    assert capfd.readouterr().err.count("traceml-ci: warning: tracing stopped") == 1


def test_busy_other_phase_is_overhead(fresh_tracer) -> None:
    clock = FakeClock()
    tracer = fresh_tracer(mode="manual", warmup_steps=0, clock=clock)
    for _ in range(12):
        with traceml.trace_step():
            clock.advance(1000.0)
    doc = finish_and_load(tracer)
    assert pct(doc, "other") == 100.0
    assert doc["step_time"]["diagnosis"] == "OVERHEAD_BOUND"


def test_zero_change_without_optimizer_steps_holds_bounded_memory(fresh_tracer, monkeypatch):
    """A hand-written SGD update never calls optimizer.step(), so the zero-change step never
    closes: its phase pieces piled up for the whole run. Past the cap the oldest half goes,
    and the backward passes are still counted for the "no steps" hint."""
    from traceml_ci.tracer import recorder

    monkeypatch.setattr(recorder, "MAX_IMPLICIT_MARKS", 100)
    tracer = fresh_tracer(zero_change=True, warmup_steps=0)
    model = torch.nn.Linear(4, 1)
    longest = 0
    for _ in range(300):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
        longest = max(longest, len(tracer.rec.marks))
    assert longest <= 101
    doc = finish_and_load(tracer)
    diag = next(d for d in doc["diagnoses"] if d["area"] == "step_time")
    assert "300 backward passes" in diag["message"], diag
