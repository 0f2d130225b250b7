"""The hot path: phase boundaries and step boundaries, nothing else.

Every call here runs on every step of a user's run. It takes one clock mark per boundary,
appends a tuple, and hands a finished step to the sink. No I/O, no statistics, no dicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DL, FWD, BWD, OPT = 0, 1, 2, 3
PHASE_INDEX = {"dataloader": DL, "forward": FWD, "backward": BWD, "optimizer": OPT}

#: Dataloader fetches kept between two steps (e.g. several zipped loaders); older ones drop.
MAX_OUTSIDE_FETCHES = 16

# A finished step: (enter mark, exit mark, [(phase, t0, t1), ...] inside, [...] fetched before)
StepSink = Callable[[Any, Any, list, list], None]


class Recorder:
    """Phase and step boundaries for one process.

    Phases are exclusive: a phase that begins while another is open (a forward re-run inside
    backward by activation checkpointing, a nested model call) counts to the open one.
    ``implicit`` is zero-change mode: with no ``trace_step``, a step ends where the next
    dataloader fetch or forward begins after an optimizer step.
    """

    __slots__ = (
        "mark",
        "sink",
        "active",
        "depth",
        "t_open",
        "in_step",
        "implicit",
        "saw_opt",
        "marks",
        "outside",
        "enter",
        "last_opt_end",
        "ready",
        "fast",
        "acc",
    )

    def __init__(self, mark: Callable[[], Any], sink: StepSink, implicit: bool = False) -> None:
        self.mark = mark
        self.sink = sink
        self.active = -1
        self.depth = 0
        self.t_open: Any = None
        self.in_step = 0
        self.implicit = implicit
        self.saw_opt = False
        self.marks: list = []
        self.outside: list = []
        self.enter: Any = None
        self.last_opt_end: Any = None
        #: The tracer knows its device and clock (set once, at the first step).
        self.ready = False
        #: Host clock, ``ready`` and not ``implicit``: the patched wrappers and StepScope take
        #: their inline fast path (one frame per phase, no tuples) instead of these methods.
        self.fast = False
        #: Fast path only: nanoseconds per phase so far in the open step (host clock).
        self.acc = [0, 0, 0, 0]

    def set_ready(self, host: bool) -> None:
        """The tracer knows its clock: on the host clock the fast path may run."""
        self.ready = host
        self.fast = host and not self.implicit

    # -- phases --------------------------------------------------------------------------
    def phase_begin(self, p: int) -> None:
        if self.active >= 0:
            if self.active == p:
                self.depth += 1
            return
        t = self.mark()
        if self.implicit:
            if self.saw_opt and p in (DL, FWD):
                self._close_implicit(t)
                t = self.mark()  # a fresh mark: a device event must belong to one step only
            if self.enter is None:
                self.enter = t
        self.active = p
        self.t_open = t

    def phase_end(self, p: int) -> None:
        if self.active != p:
            return
        if self.depth:
            self.depth -= 1
            return
        t = self.mark()
        self.active = -1
        self.record(p, self.t_open, t)
        if p == OPT:
            self.saw_opt = True
            self.last_opt_end = t

    def record(self, p: int, t0: Any, t1: Any) -> None:
        """Where a finished phase goes: the open step, or the fetches before the next one."""
        if self.in_step or self.implicit:
            self.marks.append((p, t0, t1))
        else:
            outside = self.outside
            outside.append((p, t0, t1))
            if len(outside) > MAX_OUTSIDE_FETCHES:
                del outside[0]

    def phase_abort(self, p: int) -> None:
        """The phase ended without a result (a loader's StopIteration): record nothing, and
        forget fetches since the last step -- they belonged to a loop that just ended."""
        if self.active == p:
            if self.depth:
                self.depth -= 1
                return
            self.active = -1
        if not self.in_step:
            self.outside.clear()

    def optimizer_boundary(self) -> None:
        """A step boundary without an optimizer phase (GradScaler skipped optimizer.step())."""
        self.saw_opt = True

    # -- steps ---------------------------------------------------------------------------
    def step_begin(self) -> None:
        if self.in_step:
            self.in_step += 1  # nested trace_step: the outermost one delimits the step
            return
        if self.implicit:
            # An explicit trace_step takes over from zero-change mode; drop the partial step.
            self.implicit = False
            self.fast = self.ready
            self.marks = []
            self.saw_opt = False
        self.in_step = 1
        self.active = -1
        self.depth = 0
        self.enter = self.mark()
        self.saw_opt = False

    def step_end(self, ok: bool = True) -> None:
        if self.in_step > 1:
            self.in_step -= 1
            return
        if not self.in_step:
            return
        t = self.mark()
        self.in_step = 0
        self.active = -1
        self.depth = 0
        marks, outside = self.marks, self.outside
        self.marks, self.outside = [], []
        acc = self.acc
        if any(acc):  # phases timed by the fast path (host nanoseconds) in this step
            self.acc = [0, 0, 0, 0]
            marks.extend((p, 0, ns) for p, ns in enumerate(acc) if ns)
        if ok:
            self.sink(self.enter, t, marks, outside)
        self.enter = None

    def _close_implicit(self, t: Any) -> None:
        marks = self.marks
        self.marks = []
        self.sink(self.enter, t, marks, [])
        self.enter = None
        self.saw_opt = False

    def flush(self) -> None:
        """At finish: close an open zero-change step at its last optimizer step."""
        if self.implicit and self.saw_opt and self.enter is not None:
            marks = self.marks
            self.marks = []
            self.sink(self.enter, self.last_opt_end, marks, [])
            self.enter = None
            self.saw_opt = False
