"""Nested phases are exclusive time of the innermost phase: closures, LBFGS, nested model calls.

These are the tracer's rules, so the loops spend fake time (``fakes.FakeClock``) and every
step's phases are checked exactly: a forward or backward inside ``optimizer.step(closure)`` is
forward or backward, not optimizer; each of LBFGS's closure calls counts. Attribution against
real time is test_attribution.py's (an independent stopwatch).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import traceml_ci as traceml
from tests.tracer import fakes
from tests.tracer.conftest import finish_and_load, pct
from tests.tracer.fakes import FakeClock
from tests.tracer.loops import BusyModel, BusySGD, busy_loader, closure_steps, spend_on
from traceml_ci.tracer.clocks import DeviceEventClock, HostClock
from traceml_ci.tracer.recorder import BWD, DL, FWD, OPT, Recorder
from traceml_ci.tracer.steps import PHASE_COLS, StepStore

ALL = ("dataloader", "forward", "backward", "optimizer")


def columns(tracer: Any) -> dict[str, list[float]]:
    """The tracer's per-step ms of each phase over the analysed steps."""
    return {p: tracer.store.column(PHASE_COLS[p]) for p in ALL}


def per_step(n: int, **ms: float) -> dict[str, list[float]]:
    """``n`` steps of the given ms per phase (the rest 0)."""
    return {p: [pytest.approx(ms.get(p, 0.0), abs=1e-9)] * n for p in ALL}


def test_closure_forward_and_backward_count_as_forward_and_backward(fresh_tracer) -> None:
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=2, clock=clock)
    model = BusyModel(3.0, 4.0, spend=spend)
    optimizer = BusySGD(model.parameters(), step_ms=2.0, spend=spend)
    calls = closure_steps(optimizer, model, iter(busy_loader(16, 1.0, spend=spend)), 16)
    assert calls == [1] * 16
    # Before: all of forward and backward was charged to the optimizer (90 %).
    assert columns(tracer) == per_step(14, dataloader=1.0, forward=3.0, backward=4.0,
                                       optimizer=2.0)
    doc = finish_and_load(tracer)
    assert doc["step_time"]["phase_ms"] == {"dataloader": 1.0, "forward": 3.0,
                                            "backward": 4.0, "optimizer": 2.0, "other": 0.0}
    assert [pct(doc, p) for p in ALL] == [10.0, 30.0, 40.0, 20.0]
    assert doc["step_time"]["diagnosis"] == "COMPUTE_BOUND"  # not OPTIMIZER_BOUND


def test_lbfgs_runs_the_closure_several_times_each_counted(fresh_tracer) -> None:
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=2, clock=clock)
    torch.manual_seed(0)
    model = BusyModel(1.0, 1.5, spend=spend)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3, history_size=3)
    calls = closure_steps(optimizer, model, iter(busy_loader(16, 0.5, spend=spend)), 16)
    assert max(calls) > 1  # several closure calls in a step
    # Every call's forward and backward, step by step; LBFGS's own work takes no fake time.
    analysed = calls[2:]
    assert columns(tracer) == {
        "dataloader": [pytest.approx(0.5, abs=1e-9)] * 14,
        "forward": [pytest.approx(1.0 * k, abs=1e-9) for k in analysed],
        "backward": [pytest.approx(1.5 * k, abs=1e-9) for k in analysed],
        "optimizer": [0.0] * 14,
    }
    doc = finish_and_load(tracer)
    assert doc["step_time"]["phase_ms"]["optimizer"] == 0.0


def test_zero_change_closure_steps_end_at_optimizer_steps(fresh_tracer) -> None:
    """No trace_step: a forward (and a fetch) inside optimizer.step must not close the step."""
    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(zero_change=True, warmup_steps=2, clock=clock)
    model = BusyModel(2.0, 2.0, spend=spend)
    optimizer = BusySGD(model.parameters(), step_ms=1.0, spend=spend)
    batches = iter(busy_loader(24, 1.0, spend=spend))
    assert closure_steps(optimizer, model, batches, 12, fetch_inside=True, trace=False) == [1] * 12
    doc = finish_and_load(tracer)
    assert doc["run"]["mode"] == "zero-change"
    assert doc["step_time"]["steps_total"] == 12
    assert tracer.roots.timed == [model]  # found inside the first optimizer step
    # Both fetches (before the step and inside its closure) are the step's.
    assert columns(tracer) == per_step(10, dataloader=2.0, forward=2.0, backward=2.0,
                                       optimizer=1.0)


def test_nested_model_calls_count_once(fresh_tracer) -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = BusyModel(2.0, 0.0, spend=spend)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            spend(1.0)
            return self.inner(self.inner(x)[:, :1].expand(-1, 8).contiguous())

    clock = FakeClock()
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=1, clock=clock)
    outer = Outer()
    optimizer = BusySGD(outer.parameters(), step_ms=0.5, spend=spend)
    for _ in range(8):
        with traceml.trace_step(outer, outer.inner):  # the inner model is traced too
            optimizer.zero_grad()
            out = outer(torch.randn(4, 8))
            out.sum().backward()
            optimizer.step()
    # Counted once: the inner model's calls are inside the outer forward (1 + 2 x 2 ms).
    assert columns(tracer) == per_step(7, forward=5.0, optimizer=0.5)


def _scripted_step(rec: Recorder, now: list[int]) -> None:
    """One step with nesting, at known times (ms): optimizer 1-3, forward 3-7 (a re-entry
    inside), optimizer 7-8, backward 8-14 (a recomputed forward inside), optimizer 14-15."""

    def at(ms: int) -> None:
        now[0] = ms * 1_000_000

    at(0)
    rec.step_begin()
    at(1)
    rec.phase_begin(OPT)
    at(3)
    rec.phase_begin(FWD)
    at(4)
    rec.phase_begin(FWD)  # a nested call of the same phase: counted once
    at(5)
    rec.phase_end(FWD)
    at(7)
    rec.phase_end(FWD)
    at(8)
    rec.phase_begin(BWD)
    at(9)
    rec.phase_begin(FWD)  # activation checkpointing: backward's time
    at(11)
    rec.phase_end(FWD)
    at(14)
    rec.phase_end(BWD)
    at(15)
    rec.phase_end(OPT)
    at(16)
    rec.step_end()


@pytest.mark.parametrize("clock_kind", ["host", "device_event"])
def test_general_path_nesting_with_host_and_device_marks(monkeypatch, clock_kind) -> None:
    now = [0]
    if clock_kind == "host":
        clock: Any = HostClock(now=lambda: now[0])
    else:  # fake CUDA events, stamped with the scripted time
        monkeypatch.setattr(fakes.time, "perf_counter_ns", lambda: now[0])
        clock = DeviceEventClock(fakes.FakeEventLog(lag_records=0).factory)
    store = StepStore(clock, warmup_steps=0, rss=None)
    rec = Recorder(clock.mark, store)
    for _ in range(3):
        _scripted_step(rec, now)
    store.drain_all()
    assert store.steps_total == 3
    for col, want in ((0, 16.0), (1 + DL, 0.0), (1 + FWD, 4.0), (1 + BWD, 6.0), (1 + OPT, 4.0)):
        assert store.column(col) == [pytest.approx(want)] * 3, col
    assert rec.stack == [] and rec.active == -1


def _fresh_optimizer_classes() -> type:
    """A subclass whose step calls ``super().step()`` of a base never instantiated, new per
    test (torch hooks a class's step at its first instance, once per process)."""

    class Base(torch.optim.SGD):
        def step(self, closure: Any = None) -> Any:  # type: ignore[override]
            return super().step(closure)

    class Child(Base):
        def step(self, closure: Any = None) -> Any:  # type: ignore[override]
            return super().step(closure)

    return Child


def test_subclass_step_runs_torchs_hooks_once_as_untraced(fresh_tracer) -> None:
    """A subclass's step calling ``super().step()`` goes through torch's step wrapper
    (record_function + global hooks) once per call, as without the tracer: the tracer must not
    add a second one inside the optimizer phase."""
    from torch.optim import optimizer as optim_mod

    child = _fresh_optimizer_classes()  # before the tracer starts, as a user's module would
    calls = [0]
    handle = optim_mod.register_optimizer_step_pre_hook(
        lambda *a: calls.__setitem__(0, calls[0] + 1)
    )
    try:
        model = BusyModel(0.0, 0.0)
        model(torch.randn(2, 8)).sum().backward()
        optimizer = child(model.parameters(), lr=0.01)
        optimizer.step()
        untraced = calls[0]  # 1, or 2 where torch.optim.SGD itself has an instance
        calls[0] = 0
        fresh_tracer(warmup_steps=0)
        for opt in (optimizer, child(model.parameters(), lr=0.01)):
            with traceml.trace_step(model):
                opt.step()
        assert calls[0] == 2 * untraced
    finally:
        handle.remove()


def _calls_while(run: Callable[[], Any], inside: Callable[[], bool]) -> tuple[int, int]:
    """The Python and C calls ``run()`` makes while ``inside()`` holds, as (the tracer's, the
    rest's): counts load cannot move, unlike a time. A C call is its caller's."""
    ours = os.path.dirname(traceml.__file__)
    counts = [0, 0]  # [ours, the rest]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call") and inside():
            counts[frame.f_code.co_filename.startswith(ours) is False] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return counts[0], counts[1]


def test_optimizer_phase_holds_no_tracer_work(fresh_tracer) -> None:
    """While the optimizer phase is open, a traced step makes the calls an untraced
    ``optimizer.step()`` makes and no more: the tracer's own work sits outside the phase. The
    bug this guards, a second torch step wrapper inside it, adds dozens of calls."""
    child = _fresh_optimizer_classes()
    tracer = fresh_tracer(warmup_steps=0)
    model = BusyModel(0.0, 0.0)
    optimizer = child(model.parameters(), lr=0.01)
    model(torch.randn(2, 8)).sum().backward()
    rec = tracer.rec

    def traced_step() -> None:
        with traceml.trace_step(model):
            optimizer.step()

    for _ in range(3):  # the first steps take the tracer's general path
        traced_step()
    # The fewest of a few steps: a sampled step may count FLOPs inside the phase.
    ours, traced = min(_calls_while(traced_step, lambda: rec.active == OPT) for _ in range(5))
    tracer.patches.uninstall()
    untraced = min(_calls_while(optimizer.step, lambda: True)[1] for _ in range(5))
    tracer.patches.install()
    # What the step itself runs is the same; the untraced count holds the call that ends
    # profiling, which the traced one makes outside the phase.
    assert traced in (untraced, untraced - 1), (traced, untraced)
    # The tracer's own calls in the phase: its closing clock mark, a nested class wrapper that
    # finds the phase open, and where optimizers predate it, the two global hooks per torch
    # step wrapper (each a call and an append/pop).
    assert ours <= 12, ours
