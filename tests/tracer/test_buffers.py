"""Bounded memory: per-step columns are preallocated and stay a uniform sample of the run."""

from __future__ import annotations

import tracemalloc

from traceml_ci.tracer.buffers import DEFAULT_CAPACITY, StepColumns
from traceml_ci.tracer.clocks import HostClock
from traceml_ci.tracer.recorder import BWD, FWD, OPT, Recorder
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


def test_tracer_memory_stays_under_50_mb_over_250k_steps() -> None:
    ticks = iter(range(0, 10**12, 1000))
    clock = HostClock(now=lambda: next(ticks))
    tracemalloc.start()
    store = StepStore(clock, warmup_steps=5, rss=None)
    rec = Recorder(clock.mark, store)
    for _ in range(250_000):
        rec.step_begin()
        for p in (FWD, BWD, OPT):
            rec.phase_begin(p)
            rec.phase_end(p)
        rec.step_end()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert store.steps_total == 250_000
    assert store.columns.stride == 4  # 100k exact, then halved twice
    assert peak < 50 * 2**20
