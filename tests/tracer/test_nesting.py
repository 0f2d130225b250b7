"""Nested phases are exclusive time of the innermost phase: closures, LBFGS, nested model calls.

Truth is an independent stopwatch in the same run: around the forward and backward calls inside
the closure, and around ``optimizer.step`` minus what the stopwatch saw nested inside it.
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
from tests.conftest import busy
from tests.tracer import fakes
from tests.tracer.conftest import finish_and_load, pct
from tests.tracer.loops import (
    BusyModel,
    BusySGD,
    Stopwatch,
    assert_matches_stopwatch,
    busy_loader,
    closure_loop,
    optimizer_step,
)
from traceml_ci.tracer.clocks import DeviceEventClock, HostClock
from traceml_ci.tracer.recorder import BWD, DL, FWD, OPT, Recorder
from traceml_ci.tracer.steps import StepStore

ALL = ("dataloader", "forward", "backward", "optimizer")


def assert_shares_match(doc: dict, watch: Stopwatch, walls: list[float], skip: int,
                        tracer: Any) -> None:
    """Each phase's share is the tracer's own steps' (like with like), and those steps are the
    stopwatch's, step by step (a robust statistic, not sums a loaded machine skews).

    The summary's share of a phase is its summed time over the kept steps (the tracer's far
    outliers left out) over theirs: recomputed here from the tracer's columns, to the rounding.
    Against the stopwatch, each phase agrees in most steps (``assert_matches_stopwatch``, run
    by the tests first), and more than a fifth of the steps disagreeing by over 1 ms in some
    phase fails outright. Summed shares against the stopwatch's sums were within 2 pp on a
    quiet CPU but 4 pp apart beside two busy loops and a second job (LBFGS, the optimizer's
    share): the stopwatch's step also holds the tracer's own work between steps, which a
    loaded machine stretches by 6-40 ms in a third of the steps, and preemptions between two
    marks add up in a sum. A tracer that misattributes a phase is off by 1 ms or more in most
    steps, which the per-step checks fail."""
    from traceml_ci.summary.stats import tukey_keep_mask
    from traceml_ci.summary.thresholds import Thresholds
    from traceml_ci.tracer.steps import PHASE_COLS, STEP

    steps = tracer.store.column(STEP)
    keep = tukey_keep_mask(steps, Thresholds().outlier_fence_k)
    kept = sum(w for w, k in zip(steps, keep, strict=True) if k)
    for phase in ALL:
        spent = sum(v for v, k in zip(tracer.store.column(PHASE_COLS[phase]), keep,
                                      strict=True) if k)
        assert pct(doc, phase) == pytest.approx(100.0 * spent / kept, abs=0.01), phase
    assert len(steps) == len(walls) - skip
    off = [False] * len(steps)
    for phase in ALL:
        traced = tracer.store.column(PHASE_COLS[phase])
        for i, (a, b) in enumerate(zip(traced, watch.column(phase, skip), strict=True)):
            off[i] = off[i] or abs(a - b) > 1.0
    assert sum(off) <= len(off) // 5, off


def test_closure_forward_and_backward_count_as_forward_and_backward(fresh_tracer) -> None:
    from traceml_ci.summary.stats import median

    tracer = fresh_tracer(warmup_steps=2)
    model = BusyModel(3.0, 4.0)
    optimizer = BusySGD(model.parameters(), step_ms=2.0)
    # 64 steps: the fifth of steps whose clocks may disagree (a preemption between two marks)
    # is a fraction of few steps; 7 of 30 disagreed once in a loaded full run.
    watch, walls = closure_loop(optimizer, model, iter(busy_loader(64, 1.0)), 64)
    assert_matches_stopwatch(tracer, watch, ALL)
    doc = finish_and_load(tracer)
    assert_shares_match(doc, watch, walls, 2, tracer)
    # Before: all of forward and backward was charged to the optimizer (~90 %). Against the
    # stopwatch's optimizer (its own time) of the same steps, not a ratio to the other phases:
    # on a busy runner preemption lands in the optimizer's spin more than in others' (the
    # untraced loop shows it too), while the bug adds the whole closure (>= 7 ms) to each step.
    ms = doc["step_time"]["phase_ms"]
    own = median(watch.column("optimizer", 2))
    nested = median([f + b for f, b in zip(watch.column("forward", 2),
                                           watch.column("backward", 2), strict=True)])
    assert ms["optimizer"] < own + 0.5 * nested, (ms, own, nested)
    assert ms["forward"] + ms["backward"] > 0.5 * nested, (ms, nested)
    # Not optimizer-bound where the stopwatch says the optimizer's own share is clearly under
    # the threshold (on a busy runner it can truly be over it: then the label is right).
    from traceml_ci.summary.thresholds import Thresholds

    # The diagnosis reads median-based shares; under load the stopwatch's mean and median
    # part (a full-suite run beside two busy loops: mean 22.8 %, diagnosis OPTIMIZER_BOUND).
    mean_share = 100.0 * sum(watch.column("optimizer", 2)) / sum(walls[2:])
    median_share = 100.0 * median(watch.column("optimizer", 2)) / median(walls[2:])
    share = max(mean_share, median_share)
    if share < Thresholds().optimizer_bound_pct - 5.0:
        assert doc["step_time"]["diagnosis"] != "OPTIMIZER_BOUND", share


def test_lbfgs_runs_the_closure_several_times_each_counted(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=2)
    model = BusyModel(1.0, 1.5)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3, history_size=3)
    watch, walls = closure_loop(optimizer, model, iter(busy_loader(32, 1.0)), 32)
    assert_matches_stopwatch(tracer, watch, ALL)
    doc = finish_and_load(tracer)
    assert_shares_match(doc, watch, walls, 2, tracer)
    assert doc["step_time"]["phase_ms"]["forward"] >= 2 * 1.0 - 0.2  # several closure calls


def test_zero_change_closure_steps_end_at_optimizer_steps(fresh_tracer) -> None:
    """No trace_step: a forward (and a fetch) inside optimizer.step must not close the step."""
    tracer = fresh_tracer(zero_change=True, warmup_steps=2)
    model = BusyModel(2.0, 2.0)
    optimizer = BusySGD(model.parameters(), step_ms=1.0)
    batches = iter(busy_loader(40, 1.0))
    watch = Stopwatch()
    for _ in range(12):
        watch.new_step()
        x, y = watch.time("dataloader", next, batches)

        def closure(x: Any = x, y: Any = y) -> torch.Tensor:
            watch.time("dataloader", next, batches)  # a fetch inside the step: still this step
            optimizer.zero_grad()
            loss = ((watch.time("forward", model, x) - y) ** 2).mean()
            watch.time("backward", loss.backward)
            return loss

        optimizer_step(watch, optimizer, closure)
    doc = finish_and_load(tracer)
    assert doc["run"]["mode"] == "zero-change"
    assert doc["step_time"]["steps_total"] == 12
    assert tracer.roots.timed == [model]  # found inside the first optimizer step
    assert_matches_stopwatch(tracer, watch, ALL)


def test_nested_model_calls_count_once(fresh_tracer) -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = BusyModel(2.0, 0.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            busy(1.0)
            return self.inner(self.inner(x)[:, :1].expand(-1, 8).contiguous())

    tracer = fresh_tracer(warmup_steps=1)
    outer = Outer()
    optimizer = torch.optim.SGD(outer.parameters(), lr=0.01)
    watch = Stopwatch()
    for _ in range(8):
        watch.new_step()
        with traceml.trace_step(outer, outer.inner):  # the inner model is traced too
            optimizer.zero_grad()
            out = watch.time("forward", outer, torch.randn(4, 8))
            watch.time("backward", out.sum().backward)
            watch.time("optimizer", optimizer.step)
    # Counted once: the inner model's calls are inside the outer forward the stopwatch timed.
    assert_matches_stopwatch(tracer, watch, ("forward", "backward", "optimizer"))


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
