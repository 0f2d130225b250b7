"""The job's CPU time per analysed step, read twice-ish and never per step.

Wall time per step is what a loaded runner moves most: a step waits for a CPU as long as the
machine's other work makes it. The CPU time the job itself spent per step moves far less
(measured on a 2-core VM beside two busy loops, A/A rounds: the per-round log ratio's spread
of the wall median ~48 %, of the CPU time per step ~17 %), so a host clock's step-time band
judges it (gate/judging.py; docs/gate.md).

Which CPU: the process's (all threads: torch's intra-op pool does a step's work too) minus our
own threads' (the live writer, the NVML sampler: named ``traceml-ci-*``) where the platform
gives a per-thread clock. DataLoader worker processes are not counted: finding them costs a
walk of the process table on every read.

The store reads it where the analysed window opens (the last warmup step's end), at its
housekeeping ticks (~10 Hz) and at analysed steps 1, 2, 4, 8, ... (a run shorter than a tick
still ends its window at a step's end, not at finish), with the number of analysed steps so
far; ms per step is the difference between the window's start and the last read. Torch-free;
a read that fails is None and the figure is left out.

The same reads take the wall clock and the training thread's schedstat (ns on a CPU, ns
runnable but waiting for one; Linux with schedstats). Per analysed step that splits the
window's wall time three ways: the thread on a CPU, waiting for a CPU (the machine's other
work: contention), and neither -- blocked: sleeping, reading, waiting for DataLoader workers,
torch's intra-op pool or a device. Contention moves only the wait; the code moves the other
two (the straggler analysis takes a rank's extra wait off, summary/ranks.py).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import NamedTuple

from traceml_ci.tracer.contention import schedstat

#: Our own threads' name prefix (tracer/live.py, tracer/gpu_util.py).
OWN_THREAD_PREFIX = "traceml-ci-"
#: Reads kept for a live window's split (``thread_split(since=...)``): ~6 s of ticks.
RECENT_READS = 64


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


class Reading(NamedTuple):
    """One read of the window: analysed steps so far, the job's CPU ns (ours left out), the
    wall clock, and the training thread's schedstat (None: not readable)."""

    steps: int
    cpu_ns: int
    wall_ns: int
    sched: tuple[int, int] | None


class ThreadSplit(NamedTuple):
    """The training thread's wall time per analysed step, split three ways (ms)."""

    on_cpu_ms: float  # its own CPU time
    cpu_wait_ms: float  # runnable, waiting for a CPU: the machine's other work
    blocked_ms: float  # neither: sleeping, I/O, waiting for workers, threads or a device


class CpuWindow:
    """Readings at the window's start and at its newest tick."""

    def __init__(self) -> None:
        self.first: Reading | None = None
        self.last: Reading | None = None
        #: The training thread: the one that opens the window (the settle at finish may run
        #: on another).
        self._tid: int | None = None
        #: The newest reads, oldest first: a live window's split starts at one of them.
        self.recent: deque[Reading] = deque(maxlen=RECENT_READS)

    def _read(self, steps: int) -> Reading | None:
        now = job_cpu_ns()
        if now is None:
            return None
        sched = None if self._tid is None else schedstat(self._tid)
        return Reading(steps, now, time.perf_counter_ns(), sched)

    def _advance(self, now: Reading) -> None:
        """``now`` is the newest read."""
        self.last = now
        self.recent.append(now)

    def start(self, steps: int = 0) -> None:
        """The analysed window opens: ``steps`` analysed so far (0 at the last warmup step)."""
        self._tid = threading.get_native_id()
        now = self._read(steps)
        if now is not None:
            self.first = now
            self.last = None
            self.recent.clear()
            self.recent.append(now)

    def tick(self, steps: int) -> None:
        """A housekeeping tick with ``steps`` analysed steps behind it."""
        if self.first is None:  # no warmup steps: the window opens at the first tick
            self.start(steps)
            return
        now = self._read(steps)
        if now is not None:
            self._advance(now)

    def settle(self, steps_now: int) -> None:
        """At finish, before our threads stop: with no tick past the start, a read now with
        ``steps_now`` analysed steps ends the window."""
        first, last = self.first, self.last
        if first is not None and (last is None or last.steps <= first.steps):
            now = self._read(steps_now)
            if now is not None:
                self._advance(now)

    def _span(self) -> tuple[Reading, Reading, int] | None:
        first, last = self.first, self.last
        if first is None or last is None:
            return None
        steps = last.steps - first.steps
        return (first, last, steps) if steps > 0 else None

    def ms_per_step(self) -> float | None:
        """CPU ms per analysed step over the window; None: nothing to divide."""
        span = self._span()
        if span is None or span[1].cpu_ns < span[0].cpu_ns:
            return None
        first, last, steps = span
        return (last.cpu_ns - first.cpu_ns) / steps / 1e6

    def thread_split(self, since: int | None = None) -> ThreadSplit | None:
        """The training thread's wall time per analysed step, split three ways; None without
        schedstats or steps.

        ``since``: from the newest kept read at or before that many analysed steps (a live
        window's first step; the oldest kept read where none is that old) -- safe from
        another thread: the copy of the kept reads is one C call under the GIL."""
        span = self._span()
        if span is None:
            return None
        first, last, steps = span
        if since is not None:
            kept = [r for r in tuple(self.recent) if r.steps < last.steps]
            if kept:
                first = next((r for r in reversed(kept) if r.steps <= since), kept[0])
                steps = last.steps - first.steps
        if first.sched is None or last.sched is None:
            return None
        wall = last.wall_ns - first.wall_ns
        on_cpu = last.sched[0] - first.sched[0]
        waited = last.sched[1] - first.sched[1]
        if wall <= 0 or on_cpu < 0 or waited < 0:
            return None
        # schedstat and the clock are read a few µs apart: a negative remainder is that skew
        blocked = max(wall - on_cpu - waited, 0)
        return ThreadSplit(on_cpu / steps / 1e6, waited / steps / 1e6, blocked / steps / 1e6)
