"""Small CPU training loops with known per-phase costs, for attribution tests.

Each cost is spent by ``spend(ms)``: a busy-wait (``busy``, the default: real time, checked
against a stopwatch), or a fake clock's advance (``fakes.FakeClock``: the tracer's logic in
exact microseconds, see ``spend_on``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import traceml_ci as traceml
from tests.conftest import busy
from traceml_ci.tracer.recorder import BWD, DL, FWD, OPT, Recorder


class BusyDataset(Dataset):
    """Batches cost ``batch_ms`` to fetch (spent in collate, i.e. inside next())."""

    def __init__(self, n: int, dim: int = 8) -> None:
        self.x = torch.randn(n, dim)
        self.y = torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def recorder_step(rec: Recorder) -> None:
    """One step straight through a ``Recorder``: a fetch, then forward, backward and optimizer
    inside the step, each begun and ended at once (the clock decides what they cost)."""
    rec.phase_begin(DL)
    rec.phase_end(DL)
    rec.step_begin()
    for p in (FWD, BWD, OPT):
        rec.phase_begin(p)
        rec.phase_end(p)
    rec.step_end()


def spend_on(clock: Any) -> Callable[[float], None]:
    """A ``spend`` that moves a fake clock on by ``ms`` instead of spinning."""
    return lambda ms: clock.advance(ms * 1000.0)


def busy_loader(batches: int, batch_ms: float, batch_size: int = 4,
                spend: Callable[[float], None] = busy) -> DataLoader:
    """A real DataLoader whose next() costs ``batch_ms`` (plus its own small overhead)."""
    batch = (torch.randn(batch_size, 8), torch.randn(batch_size, 1))

    def collate(items: list) -> Any:
        spend(batch_ms)
        return batch  # no stacking work: the fetch costs what we say

    return DataLoader(BusyDataset(batches * batch_size), batch_size=batch_size, collate_fn=collate)


class BusyBackward(torch.autograd.Function):
    """Identity whose backward spins: a known cost inside the autograd engine."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ms: float,  # type: ignore[override]
                spend: Callable[[float], None] = busy) -> torch.Tensor:
        ctx.ms = ms
        ctx.spend = spend
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        ctx.spend(ctx.ms)
        return grad, None, None


class BusyModel(nn.Module):
    """Forward costs ``forward_ms``; its backward costs ``backward_ms`` (a custom autograd op)."""

    def __init__(self, forward_ms: float, backward_ms: float, dim: int = 8,
                 spend: Callable[[float], None] = busy) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, 1)
        self.forward_ms = forward_ms
        self.backward_ms = backward_ms
        self.spend = spend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.spend(self.forward_ms)
        return BusyBackward.apply(self.lin(x), self.backward_ms, self.spend)


class BusySGD(torch.optim.SGD):
    """SGD whose step costs ``step_ms``."""

    def __init__(self, params: Any, step_ms: float,
                 spend: Callable[[float], None] = busy) -> None:
        super().__init__(params, lr=0.01)
        self.step_ms = step_ms
        self.spend = spend

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self.spend(self.step_ms)
        return super().step(closure)


def one_ahead(loader: Any) -> Iterator[Any]:
    """accelerate's DataLoaderShard: fetch the next batch before yielding the current one."""
    it = iter(loader)
    current = next(it)
    while True:
        try:
            following = next(it)
        except StopIteration:
            yield current
            return
        yield current
        current = following


def train(loader: Any, model: nn.Module, optimizer: Any, trace_step: Any, steps: int) -> int:
    """The canonical loop from the README; returns the number of steps run."""
    done = 0
    for x, y in loader:
        with trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
        done += 1
        if done >= steps:
            break
    return done


def fake_device_run(fresh_tracer: Any, log: Any, steps: int, fetch_ms: float, forward_ms: float,
                    backward_ms: float, optimizer_ms: float) -> Any:
    """The README loop on a fake device (``log``: a ``FakeEventLog`` whose events carry a
    ``FakeClock``'s time, spent by each phase): ``steps`` steps after 2 warmup steps' worth of
    tracer, which it returns."""
    from tests.tracer.fakes import FakeClock

    clock = FakeClock()
    log.now = clock.mark  # the "device" events carry the fake clock's time
    spend = spend_on(clock)
    tracer = fresh_tracer(warmup_steps=2, clock=clock)
    model = BusyModel(forward_ms, backward_ms, spend=spend)
    optimizer = BusySGD(model.parameters(), optimizer_ms, spend=spend)
    train(busy_loader(steps, fetch_ms, spend=spend), model, optimizer, traceml.trace_step, steps)
    return tracer


def train_at_least(model: nn.Module, optimizer: Any, x: torch.Tensor, y: torch.Tensor,
                   steps: int, seconds: float, after_backward: Any = None) -> int:
    """The README loop on one batch: ``steps`` steps, and more until ``seconds`` went by
    (module samples are due by time); ``after_backward()`` runs inside each step, between
    backward and the optimizer. Returns the number of steps run."""
    end = time.perf_counter() + seconds
    done = 0
    while done < steps or time.perf_counter() < end:
        done += 1
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            ((model(x) - y) ** 2).mean().backward()
            if after_backward is not None:
                after_backward()
            optimizer.step()
    return done


def busy_job(steps: int, ms: float, spend: Callable[[float], None] = busy) -> int:
    """``steps`` README steps of a job whose fetch, forward and backward each cost ``ms``
    (plain SGD; ``spend``: spins, or a fake clock's ``spend_on``), traced by ``trace_step``;
    returns the number of steps run."""
    model = BusyModel(ms, ms, spend=spend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return train(busy_loader(steps, ms, spend=spend), model, optimizer, traceml.trace_step,
                 steps)


class Stopwatch:
    """An independent per-step stopwatch around exactly the calls the tracer attributes, so
    tests compare the tracer with the truth of the same steps, however loaded the machine is."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self.walls: list[float] = []  # each step's wall time (ms), kept by ``fetches``

    def new_step(self) -> None:
        self.steps.append(dict.fromkeys(("dataloader", "forward", "backward", "optimizer"), 0.0))

    def fetches(self, batches: Any, steps: int, after_step: Any = None) -> Iterator[Any]:
        """``steps`` steps of a loop: each begins a stopwatch step and hands the loop's body a
        batch fetched on it (dataloader); the step's wall time, fetch and body, goes to
        ``walls``; then ``after_step()`` runs, outside what is timed."""
        for _ in range(steps):
            start = time.perf_counter_ns()
            self.new_step()
            yield self.time("dataloader", next, batches)
            self.walls.append((time.perf_counter_ns() - start) / 1e6)
            if after_step is not None:
                after_step()

    def time(self, phase: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            self.steps[-1][phase] += (time.perf_counter_ns() - start) / 1e6

    def column(self, phase: str, skip: int) -> list[float]:
        return [s[phase] for s in self.steps[skip:]]


def assert_matches_stopwatch(tracer: Any, watch: Stopwatch, phases: tuple[str, ...]) -> None:
    """The tracer's per-step milliseconds of each phase agree with the stopwatch, step by step
    (median absolute difference under 0.3 ms: a preemption between the two clocks' marks may
    hit a single step, never most of them; an LBFGS step's three closures put their marks'
    gaps in most steps: 0.06-0.1 ms quiet or beside two busy loops, 0.25 in a loaded suite --
    a phase misattributed is 1 ms or more here)."""
    from traceml_ci.summary.stats import median
    from traceml_ci.tracer.steps import PHASE_COLS

    skip = tracer.store.warmup_steps
    for phase in phases:
        traced = tracer.store.column(PHASE_COLS[phase])
        truth = watch.column(phase, skip)
        assert len(traced) == len(truth), phase
        diffs = [abs(a - b) for a, b in zip(traced, truth, strict=True)]
        assert median(diffs) < 0.3, (phase, traced[:5], truth[:5])


def stopwatch_loop(
    model: nn.Module, optimizer: Any, batches: Any, steps: int,
    after_step: Any = None,
) -> tuple[Stopwatch, list[float]]:
    """The README loop, each phase on the stopwatch: a fetch, then ``trace_step`` around
    zero_grad / forward / backward / step. Returns the stopwatch and each step's wall time in
    ms; ``after_step()`` runs between steps, outside what is timed."""
    watch = Stopwatch()
    for x, y in watch.fetches(batches, steps, after_step):
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            loss = ((watch.time("forward", model, x) - y) ** 2).mean()
            watch.time("backward", loss.backward)
            watch.time("optimizer", optimizer.step)
    return watch, watch.walls


def closure_loop(
    optimizer: Any, model: nn.Module, batches: Any, steps: int, trace: bool = True
) -> tuple[Stopwatch, list[float]]:
    """``optimizer.step(closure)`` with forward and backward in the closure; returns the
    stopwatch (optimizer = its own time) and each step's wall time in ms."""
    watch = Stopwatch()
    for x, y in watch.fetches(batches, steps):

        def closure(x: Any = x, y: Any = y) -> torch.Tensor:
            optimizer.zero_grad()
            loss = ((watch.time("forward", model, x) - y) ** 2).mean()
            watch.time("backward", loss.backward)
            return loss

        with traceml.trace_step(model) if trace else _Null():
            optimizer_step(watch, optimizer, closure)
    return watch, watch.walls


def closure_steps(optimizer: Any, model: nn.Module, batches: Iterator[Any], steps: int,
                  fetch_inside: bool = False, trace: bool = True) -> list[int]:
    """``optimizer.step(closure)`` with forward and backward in the closure (and, with
    ``fetch_inside``, a fetch as well); returns each step's number of closure calls."""
    calls: list[int] = []
    for _ in range(steps):
        x, y = next(batches)
        calls.append(0)

        def closure(x: Any = x, y: Any = y) -> torch.Tensor:
            calls[-1] += 1
            if fetch_inside:
                next(batches)  # a fetch inside the step: still this step
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            return loss

        if trace:
            with traceml.trace_step(model):
                optimizer.step(closure)
        else:
            optimizer.step(closure)
    return calls


def optimizer_step(watch: Stopwatch, optimizer: Any, closure: Any) -> None:
    """``optimizer.step(closure)`` on the stopwatch: the optimizer's own time is the call's
    time minus the phases the stopwatch saw inside it (the closure's glue stays its own)."""
    step = watch.steps[-1]
    before = sum(v for p, v in step.items() if p != "optimizer")
    watch.time("optimizer", optimizer.step, closure)
    step["optimizer"] -= sum(v for p, v in step.items() if p != "optimizer") - before


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False
