"""Bounded memory: per-step columns are preallocated and stay a uniform sample of the run."""

from __future__ import annotations

import tracemalloc

from tests.tracer.loops import recorder_step
from traceml_ci.tracer.buffers import DEFAULT_CAPACITY, StepColumns
from traceml_ci.tracer.clocks import HostClock
from traceml_ci.tracer.recorder import Recorder
from traceml_ci.tracer.steps import StepStore


def test_exact_until_capacity_then_a_uniform_sample() -> None:
    cols = StepColumns(2, capacity=8)
    for i in range(8):
        cols.append((float(i), 2.0 * i))
    assert cols.column(0) == [float(i) for i in range(8)] and cols.stride == 1
    for i in range(8, 100):
        cols.append((float(i), 2.0 * i))
    assert cols.n <= 8
    kept = cols.column(0)
    step = cols.stride
    assert step == 16
    assert kept == [float(i) for i in range(0, 100, step)][: cols.n]
    assert cols.column(1) == [2 * v for v in kept]


def test_footprint_does_not_grow_with_steps() -> None:
    cols = StepColumns(7)
    before = cols.nbytes
    for i in range(DEFAULT_CAPACITY + 10):
        cols.append((1.0, 2.0, 3.0, 4.0, 5.0, 6.0, float(i)))
    assert cols.nbytes == before < 50 * 2**20


def test_tracer_memory_does_not_grow_with_steps_and_is_bounded() -> None:
    """The bound without running 250k steps: the full recorder -> store path on a small
    capacity keeps a constant footprint once its columns are full (no per-step leak), and the
    default columns, allocated once, are the whole of it: under 50 MB."""
    ticks = iter(range(0, 10**12, 1000))
    clock = HostClock(now=lambda: next(ticks))
    store = StepStore(clock, warmup_steps=5, rss=None, capacity=1000)
    rec = Recorder(clock.mark, store)

    def steps(n: int) -> None:
        for _ in range(n):
            recorder_step(rec)

    steps(2_005)  # past capacity once: the columns have halved
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        steps(14_000)
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert store.steps_total == 16_005
    assert store.columns.n <= 1000 and store.columns.stride == 16  # a uniform sample
    assert after - before < 16 * 1024 and peak - before < 64 * 1024
    assert StepStore(clock, warmup_steps=5, rss=None).columns.nbytes < 50 * 2**20
