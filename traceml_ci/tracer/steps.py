"""Where finished steps go: warmup accounting, lazy device-event resolution, compact columns."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from traceml_ci.tracer.buffers import DEFAULT_CAPACITY, StepColumns
from traceml_ci.tracer.cputime import CpuWindow
from traceml_ci.tracer.memory import RSS_INTERVAL_NS, CudaMemory, RssSampler
from traceml_ci.tracer.recorder import PHASE_INDEX, PRE, SAMPLES

#: Steps the device may lag behind the host before we wait for the oldest one. Only reached when
#: the host runs far ahead, so waiting then costs the run nothing it was not already losing.
MAX_PENDING_STEPS = 64

# Column layout of StepColumns rows: the step's time, one column per phase (1 + the recorder's
# phase index), then the step's device memory peaks.
STEP = 0
PHASE_COLS = {name: 1 + i for name, i in PHASE_INDEX.items()}
ALLOC_COL = 1 + len(PHASE_COLS)
RESERVED_COL = ALLOC_COL + 1


class StepStore:
    """The recorder's sink. Host clock: a step is resolved at once. Device clock: its events are
    queued and resolved when the device has passed them (``query()``), a few steps later."""

    def __init__(
        self,
        clock: Any,
        warmup_steps: int,
        rss: RssSampler | None,
        capacity: int = DEFAULT_CAPACITY,
        max_steps: int | None = None,
    ) -> None:
        self.clock = clock
        self.host = clock.kind == "host"
        self.warmup_steps = warmup_steps
        #: Steps after the first ``max_steps`` (warmup included) are dropped, not recorded.
        self.max_steps = max_steps
        self._cap = sys.maxsize if max_steps is None else max_steps
        self.rss = rss
        #: Between-step housekeeping (RSS samples, ``tick``) is due at this host mark: one
        #: comparison per step, whatever is due.
        self._due: float = 0
        #: How often housekeeping runs: the RSS interval, or a module sample period if shorter.
        self.tick_ns = RSS_INTERVAL_NS
        self.cuda_memory: CudaMemory | None = None
        self.columns = StepColumns(RESERVED_COL + 1, capacity)
        self.steps_total = 0  # steps handed to us
        self.resolved = 0  # steps resolved, in order
        self.pending: deque = deque()
        #: DataLoader samples over the analysed (post-warmup) steps, all of them (no stride).
        self.samples_analyzed = 0
        #: Housekeeping's (step number, host ns) at the end of a step: the first after warmup
        #: and the newest. Between them, wall time that no step covers is time spent between
        #: steps -- an evaluation, checkpointing (``between_steps``); read ~10 times a second.
        self.wall_first: tuple[int, int] | None = None
        self.wall_last: tuple[int, int] | None = None
        #: Host steps know their window exactly: the last warmup step's end and the newest
        #: analysed step's end (host ns; None until seen). A window cut at housekeeping marks
        #: lost up to a tick at each end, and the evaluations in it, on short runs.
        self.warm_exit: int | None = None
        self.exit_last: int | None = None
        #: Called with the host clock's time between steps, every ``tick_ns`` at most: module
        #: sampling arms itself there (tracer/modules.py), never per step.
        self.tick: Any = None
        #: The job's CPU time over the analysed window (tracer/cputime.py), host steps only:
        #: read at the last warmup step, at housekeeping and at analysed steps 1, 2, 4, ...
        #: (``_cpu_read_at``), never every analysed step.
        self.cpu = CpuWindow()
        #: Host steps: the step number at which the CPU window is read besides housekeeping --
        #: analysed steps 1, 2, 4, 8, ...: a run shorter than a tick still ends its window at a
        #: step's end (at least half its analysed steps), not at finish, whose own work (the
        #: script's end, the summary) is no step's. Warmup steps walk it up one by one.
        self._cpu_read_at = 1

    def set_clock(self, clock: Any, cuda_memory: CudaMemory | None) -> None:
        """Switch clocks once, before any step is recorded (the first step tells the device)."""
        self.drain(wait=True)
        self.clock = clock
        self.host = clock.kind == "host"
        self.cuda_memory = cuda_memory

    def __call__(
        self, enter: Any, exit_: Any, marks: list, outside: list, samples: int = 0, pre: int = 0
    ) -> None:
        """A step timed the general way; ``pre``: host ns the fast path fetched before it (a
        step after a loader that fetched ahead ran out)."""
        cap = self.max_steps
        if cap is not None and self.steps_total >= cap:
            if not self.host:  # keep the event pool bounded past the cap
                self._release(enter, exit_, marks, outside)
            return
        if self.host:  # a host step timed the general way: all its phases are in the marks
            self.host_step(enter, exit_, [0, 0, 0, 0, 0, 0, pre, samples], marks, outside)
            return
        self.steps_total += 1
        now = time.perf_counter_ns()
        if now >= self._due:  # housekeeping, as host steps do
            self._due = now + self.tick_ns
            if self.rss is not None:
                self.rss.maybe_sample(self.steps_total, now)
            if self.tick is not None:
                self.tick(now)
            self._wall(self.steps_total, now)
        mem = self.cuda_memory.read_and_reset() if self.cuda_memory is not None else (0.0, 0.0)
        self.pending.append((enter, exit_, marks, outside, mem, samples))
        self.drain(wait=len(self.pending) > MAX_PENDING_STEPS)

    def host_step(self, enter: int, exit_: int, acc: list, marks: list, outside: list) -> None:
        """A host-clock step whose phases were summed as they ran by the fast path (``acc``:
        nanoseconds per phase, dataloader nanoseconds before the step, samples; see
        ``recorder.ACC_ZERO``); ``marks`` and ``outside`` hold phases timed the general way."""
        n = self.steps_total
        if n >= self._cap:
            return
        self.steps_total = n = n + 1
        if n == self._cpu_read_at:
            warmup = self.warmup_steps
            if n <= warmup:
                self._cpu_read_at = n + 1
            else:
                self._cpu_read_at = 2 * n - warmup  # twice the analysed steps so far
                if exit_ < self._due:  # (else housekeeping reads it below)
                    self.cpu.tick(n - warmup)
        if exit_ >= self._due:  # ~10 times a second, between steps: housekeeping
            self._due = exit_ + self.tick_ns
            if n > self.warmup_steps:  # first: the step's CPU, not ours below
                self.cpu.tick(n - self.warmup_steps)
            rss = self.rss
            if rss is not None:
                rss.maybe_sample(n, exit_)
            if self.tick is not None:
                self.tick(exit_)
            self._wall(n, exit_)
        before = acc[PRE]  # the batch fetched before the step, by the fast path
        for p, t0, t1 in outside:  # ... or the general way
            before += t1 - t0
            acc[p] += t1 - t0
        for p, t0, t1 in marks:
            acc[p] += t1 - t0
        self.resolved = n  # host steps resolve at once, in order
        if n > self.warmup_steps:
            self.exit_last = exit_
            self.samples_analyzed += acc[SAMPLES]
            # Nanoseconds: the columns of a host store are scaled to ms when read (column()).
            self.columns.append_host(
                exit_ - enter + before, acc[0] + acc[PRE], acc[1], acc[2], acc[3], acc[4],
                acc[5],
            )
        else:  # the analysed window opens where the last warmup step ends
            self.warm_exit = exit_
            if n == self.warmup_steps:
                self.cpu.start()

    def _wall(self, n: int, now_ns: int) -> None:
        if n > self.warmup_steps:
            self.wall_last = (n, now_ns)
            if self.wall_first is None:
                self.wall_first = self.wall_last

    def analysed_window(self) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        """(step number, host ns) at the window's two ends: exact for host steps, else the
        housekeeping marks (rows after the first's step number are inside)."""
        first, last = self.wall_first, self.wall_last
        if self.host and self.exit_last is not None:
            last = (self.steps_total, self.exit_last)
            if self.warm_exit is not None:
                first = (self.warmup_steps, self.warm_exit)
        return first, last

    def column(self, i: int) -> list[float]:
        """Column ``i`` of the kept rows, times in milliseconds."""
        values = self.columns.column(i)
        if self.host and i < ALLOC_COL:  # host rows hold nanoseconds (see host_step)
            return [v / 1e6 for v in values]
        return values

    def drain(self, wait: bool = False) -> None:
        """Resolve queued steps whose events have all completed; ``wait`` blocks on the oldest."""
        pending = self.pending
        while pending:
            if not self._ready(pending[0], wait):
                return
            wait = False  # waiting once frees what was recorded before it
            self._resolve(pending.popleft())

    def drain_all(self) -> None:
        """At finish: one wait on the newest step frees all older ones on the same stream."""
        if self.pending:
            self.clock.wait(self.pending[-1][1])
        while self.pending:
            self._ready(self.pending[0], wait=True)
            self._resolve(self.pending.popleft())

    def _ready(self, item: tuple, wait: bool) -> bool:
        """True when every event of the step has completed. The exit event is checked first:
        on one stream it completes last, so a pending step costs a single query()."""
        clock = self.clock
        enter, exit_, marks, outside = item[:4]
        if not clock.ready(exit_):
            if not wait:
                return False
            clock.wait(exit_)
        # Phases may have been recorded on other streams (``with torch.cuda.stream(s)``).
        for ev in _events(enter, marks, outside):
            if not clock.ready(ev):
                if not wait:
                    return False
                clock.wait(ev)
        return True

    def _resolve(self, item: tuple) -> None:
        enter, exit_, marks, outside, mem, samples = item
        el = self.clock.elapsed_ms
        ph = [0.0] * len(PHASE_INDEX)
        before = 0.0
        for p, t0, t1 in marks:
            ph[p] += el(t0, t1)
        for p, t0, t1 in outside:
            d = el(t0, t1)
            ph[p] += d
            before += d
        step = el(enter, exit_) + before
        if self.clock.kind != "host":
            self._release(enter, exit_, marks, outside)
        self.resolved += 1
        if self.resolved <= self.warmup_steps:
            return
        self.samples_analyzed += samples
        self.columns.append((max(step, 0.0), *ph, mem[0], mem[1]))

    def _release(self, enter: Any, exit_: Any, marks: list, outside: list) -> None:
        # Boundaries can be shared (a phase starting at the step's enter mark): release once.
        seen = {id(ev): ev for ev in _events(enter, marks, outside)}
        seen[id(exit_)] = exit_
        for ev in seen.values():
            self.clock.release(ev)


def _events(enter: Any, marks: list, outside: list) -> Iterator[Any]:
    yield enter
    for _, t0, t1 in marks:
        yield t0
        yield t1
    for _, t0, t1 in outside:
        yield t0
        yield t1
