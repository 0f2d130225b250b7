"""The job's CPU time per analysed step, read twice-ish and never per step.

Wall time per step is what a loaded runner moves most: a step waits for a CPU as long as the
machine's other work makes it. The CPU time the job itself spent per step moves far less
(measured on a 2-core VM beside two busy loops, A/A rounds: the per-round log ratio's spread
of the wall median ~48 %, of the CPU time per step ~17 %), so A/B mode judges it too
(gate/ab.py, ``step_cpu``).

Which CPU: the process's (all threads: torch's intra-op pool does a step's work too) minus our
own threads' (the live writer, the NVML sampler: named ``traceml-ci-*``) where the platform
gives a per-thread clock. DataLoader worker processes are not counted: finding them costs a
walk of the process table on every read.

The store reads it where the analysed window opens (the last warmup step's end) and at its
housekeeping ticks (~10 Hz) with the number of analysed steps so far; ms per step is the
difference between the window's start and the last tick. Torch-free; a read that fails is
None and the figure is left out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: Our own threads' name prefix (tracer/live.py, tracer/gpu_util.py).
OWN_THREAD_PREFIX = "traceml-ci-"


def _thread_cpu_ns(ident: int | None) -> int:
    """CPU ns of the thread ``ident`` (a pthread id), 0 where the platform cannot say."""
    if ident is None:
        return 0
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(ident))
    except (AttributeError, OSError, ValueError, OverflowError):
        return 0


def own_threads_cpu_ns() -> int:
    """CPU ns our own threads have used so far (live threads only: one that has stopped took
    its figure with it, so callers take it at both ends of a window while it runs)."""
    return sum(
        _thread_cpu_ns(t.ident)
        for t in threading.enumerate()
        if t.name.startswith(OWN_THREAD_PREFIX) and t.is_alive()
    )


def job_cpu_ns() -> int | None:
    """The process's CPU ns so far, our own threads' left out; None where unreadable."""
    try:
        total = time.process_time_ns()
    except OSError:
        return None
    return total - own_threads_cpu_ns()


class CpuWindow:
    """(analysed steps, CPU ns) at the window's start and at its newest tick."""

    def __init__(self) -> None:
        self.first: tuple[int, int] | None = None
        self.last: tuple[int, int] | None = None
        #: CPU ns so far of work we ran on the job's own thread (tracer/cpuref.py): not the job's.
        self.ours: Callable[[], int] | None = None

    def _read(self) -> int | None:
        now = job_cpu_ns()
        ours = self.ours
        return now if now is None or ours is None else now - ours()

    def start(self, steps: int = 0) -> None:
        """The analysed window opens: ``steps`` analysed so far (0 at the last warmup step)."""
        now = self._read()
        if now is not None:
            self.first = (steps, now)
            self.last = None

    def tick(self, steps: int) -> None:
        """A housekeeping tick with ``steps`` analysed steps behind it."""
        if self.first is None:  # no warmup steps: the window opens at the first tick
            self.start(steps)
            return
        now = self._read()
        if now is not None:
            self.last = (steps, now)

    def settle(self, steps_now: int) -> None:
        """At finish, before our threads stop: with no tick past the start, a read now with
        ``steps_now`` analysed steps ends the window."""
        first, last = self.first, self.last
        if first is not None and (last is None or last[0] <= first[0]):
            now = self._read()
            if now is not None:
                self.last = (steps_now, now)

    def ms_per_step(self) -> float | None:
        """CPU ms per analysed step over the window; None: nothing to divide."""
        first, last = self.first, self.last
        if first is None or last is None:
            return None
        steps = last[0] - first[0]
        if steps <= 0 or last[1] < first[1]:
            return None
        return (last[1] - first[1]) / steps / 1e6
