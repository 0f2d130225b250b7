"""A fixed CPU workload run between steps in A/B runs: how fast this machine's CPU is now.

A loaded runner slows the job's own CPU time too, not only its wall time: a busy sibling
hyperthread, a cache shared with other work. Measured on a 2-core VM with busy loops starting
and stopping at random (benchmarks/ab_cpu.py): the job's CPU ms per step moved
12-25 % between A/A rounds. A fixed workload timed on the same thread right after each step
moves with it, so the job's CPU over the workload's (``step_time.cpu_reference_ms``) is the
job's cost in units of this machine as it ran: its A/A spread was 4.4 % (docs/gate.md).

Only when asked (``TRACEML_CI_CPU_REFERENCE=1``, which A/B mode sets for both sides), on the
host clock, after each analysed step: outside the step (trace_step: between steps; zero-change
mode: after the step is closed and before the next opens), and its CPU is left out of the
job's (``tracer/cputime.py``): about 1 ms of CPU a step on a loaded 2-core VM. It touches
nothing of the user's: its own tensors from its own generator (the global RNG is not drawn
from), grad enabled for itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Pure-Python loop iterations of the workload (the interpreter's part of a step).
LOOP = 2000
#: The workload's layer sizes: a small MLP's forward and backward (torch's part of a step).
SIZES = (16, 64, 128, 10)


class CpuReference:
    """Runs the workload and adds up its thread CPU time."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self.warn = warn
        #: Thread CPU ns of every run so far, and how many runs.
        self.ns = 0
        self.runs = 0
        self._tensors: tuple[Any, ...] | None = None
        self._off = False

    def _build(self) -> tuple[Any, ...]:
        import torch

        g = torch.Generator().manual_seed(0)
        batch, inp, hidden, out = SIZES
        x = torch.randn(batch, inp, generator=g)
        w1 = (torch.randn(hidden, inp, generator=g) * 0.1).requires_grad_()
        w2 = (torch.randn(out, hidden, generator=g) * 0.1).requires_grad_()
        return torch, x, w1, w2

    def run(self) -> None:
        """One run of the workload on this thread, timed by its CPU clock; never raises."""
        if self._off:
            return
        t0 = time.thread_time_ns()
        try:
            if self._tensors is None:
                self._tensors = self._build()
                t0 = time.thread_time_ns()  # building is not the workload
            torch, x, w1, w2 = self._tensors
            total = 0
            for i in range(LOOP):
                total += i
            with torch.enable_grad():
                h = torch.nn.functional.linear(x, w1).relu()
                torch.nn.functional.linear(h, w2).square().mean().backward()
            w1.grad = w2.grad = None
        except Exception as exc:
            self._off = True
            self.warn(f"CPU reference off ({exc!r}); A/B judges raw CPU time")
            return
        self.ns += time.thread_time_ns() - t0
        self.runs += 1

    def ms(self) -> float | None:
        """The workload's mean thread CPU ms per run; None: it never ran."""
        return self.ns / self.runs / 1e6 if self.runs and not self._off else None

    def after_steps(self, store: Any) -> None:
        """Run once after each analysed host-clock step of ``store`` (a StepStore): its
        ``host_step`` is wrapped on the instance, so a run without the reference pays
        nothing."""
        inner = store.host_step
        warmup = store.warmup_steps
        run = self.run

        def host_step(enter: int, exit_: int, acc: list, marks: list, outside: list) -> None:
            before = store.steps_total
            inner(enter, exit_, acc, marks, outside)
            n = store.steps_total
            if n > warmup and n != before:  # a step it kept: none past ``max_steps``
                run()

        store.host_step = host_step
