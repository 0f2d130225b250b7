"""``step_time.cpu_ms``: the job's CPU ms per analysed step, against a stopwatch of the same
run's CPU (``time.thread_time_ns`` of the one thread that trains), with our own threads left out.

Bounds are loose (a loaded 2-core runner): what is checked is that the figure is CPU time of
the steps -- not wall time (a sleeping step), not our threads' -- within a factor."""

from __future__ import annotations

import threading
import time

import torch
from torch import nn

import traceml_ci as traceml
from tests.tracer.conftest import finish_and_load
from traceml_ci.tracer.cputime import OWN_THREAD_PREFIX, CpuWindow

WARMUP = 3
SLEEP_S = 0.002


def _train(seconds: float, sleep: bool = False) -> tuple[int, int]:
    """Steps for about ``seconds`` after the warmup; (analysed steps, their thread CPU ns)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    steps, cpu0, end = 0, 0, None
    while end is None or time.perf_counter() < end:
        if steps == WARMUP:
            cpu0, end = time.thread_time_ns(), time.perf_counter() + seconds
        with traceml.trace_step(model):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if sleep:
                time.sleep(SLEEP_S)
        steps += 1
    return steps - WARMUP, time.thread_time_ns() - cpu0


def test_cpu_ms_is_the_steps_cpu_time_not_their_wall_time(fresh_tracer) -> None:
    tracer = fresh_tracer(warmup_steps=WARMUP)
    steps, cpu_ns = _train(0.8, sleep=True)
    st = finish_and_load(tracer)["step_time"]
    stopwatch_ms = cpu_ns / steps / 1e6
    assert 0.6 * stopwatch_ms <= st["cpu_ms"] <= 1.6 * stopwatch_ms + 0.05
    # each step sleeps 2 ms: on the wall clock, never on the CPU's
    assert st["step_ms"]["median"] >= st["cpu_ms"] + 0.8 * SLEEP_S * 1e3


def test_our_own_threads_cpu_is_left_out(fresh_tracer) -> None:
    # a thread of ours spinning beside the loop would double the process's CPU per step
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=spin, name=f"{OWN_THREAD_PREFIX}test-spin", daemon=True)
    tracer = fresh_tracer(warmup_steps=WARMUP)
    spinner.start()
    try:
        steps, cpu_ns = _train(0.8)
        spin_ns = time.clock_gettime_ns(time.pthread_getcpuclockid(spinner.ident))
    finally:
        stop.set()
        spinner.join()
    st = finish_and_load(tracer)["step_time"]
    stopwatch_ms = cpu_ns / steps / 1e6
    assert spin_ns > 0.3 * cpu_ns  # the spinner did take a real share of the CPU
    assert 0.6 * stopwatch_ms <= st["cpu_ms"] <= 1.6 * stopwatch_ms + 0.05


def test_a_window_needs_steps_between_its_reads() -> None:
    window = CpuWindow()
    assert window.ms_per_step() is None  # never opened
    window.start()
    window.settle(0)  # no analysed step: nothing to divide by
    assert window.ms_per_step() is None
    window = CpuWindow()
    window.tick(4)  # no warmup: the first tick opens the window
    sum(range(200_000))
    window.tick(9)
    got = window.ms_per_step()
    assert got is not None and got > 0
