"""The hot path: phase and step boundaries, and the only code that writes the per-step state.

Every call here runs on every step of a user's run. It takes one clock mark per boundary,
adds to a per-phase sum or appends a tuple, and hands a finished step to the store. No I/O,
no statistics, no dicts. The patches (``patches.py``) and the step scope (``session.py``) only
call into this module: the timed wrappers they install are built here, by ``Recorder.timed``
and ``Recorder.timed_next``.

Phases are exclusive time of the innermost phase: a phase that begins while another is open
suspends it (a forward and backward inside ``optimizer.step(closure)`` are forward and backward;
the optimizer keeps only its own time) and resumes it when it ends. Two exceptions, both counted
once to the phase already open: a phase re-entered inside itself (a nested model call, a
subclass's ``step`` calling ``super().step()``), and a forward that runs inside backward -- the
recomputation of activation checkpointing, which is backward's cost.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from traceml_ci.summary.keys import MEASURED_PHASES

#: Each measured phase's slot in ``Recorder.acc`` (and, one further, its column in the store):
#: the summary's order, so a slot and the phase name it is summarised under cannot part.
PHASE_INDEX = {name: i for i, name in enumerate(MEASURED_PHASES)}
DL, FWD, BWD, OPT, WAIT, H2D = (
    PHASE_INDEX[p] for p in ("dataloader", "forward", "backward", "optimizer", "wait", "h2d")
)

#: For each phase ``p`` (by slot): the open phases that keep counting when ``p`` begins
#: inside them.
_ABSORBED = {
    DL: frozenset({DL}),
    FWD: frozenset({FWD, BWD}),  # a forward recomputed in backward (activation checkpointing)
    BWD: frozenset({BWD}),
    OPT: frozenset({OPT}),
    WAIT: frozenset({WAIT}),  # a collective built on another (all_gather_object's all_gather)
    H2D: frozenset({H2D}),  # a copy made of copies (``.to`` of a nested structure, ``.cuda``)
}
ABSORBED_BY: tuple[frozenset[int], ...] = tuple(_ABSORBED[i] for i in range(len(PHASE_INDEX)))
#: For each phase (by slot): the phase that may have taken over from it and ends with it, or
#: -2 (none). Backward's wait: DDP's all-reduce is waited for at the end of backward, from when
#: the last gradient became ready (``Recorder.grads_ready``) until backward returns.
ENDS_WITH: tuple[int, ...] = tuple(WAIT if i == BWD else -2 for i in range(len(PHASE_INDEX)))

#: Extra slots of ``Recorder.acc`` after the measured phases: dataloader nanoseconds fetched
#: before the step (fast path), and DataLoader samples in the step.
PRE, SAMPLES = 6, 7
#: ``acc`` of a step that has not begun.
ACC_ZERO = (0, 0, 0, 0, 0, 0, 0, 0)

#: General path: fetches kept between two steps (e.g. several zipped loaders); older ones drop.
#: (The fast path sums them in ``acc[PRE]``; a loop that ends, StopIteration, forgets both --
#: once the next fetch shows that it really ended, see ``Recorder.loop_end``.)
MAX_OUTSIDE_FETCHES = 16
#: Phase pieces one zero-change step may hold. A script that never calls optimizer.step() (a
#: hand-written SGD update) never closes its step: past this, the oldest half is dropped, so
#: the tracer's memory stays bounded however long it runs (about 100 bytes a piece).
MAX_IMPLICIT_MARKS = 50_000

#: Set on each DataLoader iterator (class default None): samples per batch it yields, 0 unknown.
SAMPLES_ATTR = "_traceml_ci_samples"

Fail = Callable[[BaseException], None]


class Recorder:
    """Phase and step boundaries for one process.

    ``active`` is the phase whose time runs now (-1: none), ``t_open`` when it last started or
    resumed; ``stack`` holds what each open phase of the general path suspended. ``implicit`` is
    zero-change mode: with no ``trace_step``, a step ends where the next dataloader fetch or
    forward begins, outside any phase, after an optimizer step.
    """

    __slots__ = (
        "mark",
        "store",
        "active",
        "t_open",
        "stack",
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
        "loop_end",
        "began_fetching",
        "ahead",
        "dropped_bwd",
        "on_close",
    )

    def __init__(self, mark: Callable[[], Any], store: Any, implicit: bool = False) -> None:
        self.mark = mark
        #: Where finished steps go (a StepStore): ``store(enter, exit, marks, outside)``, or
        #: ``store.host_step(enter, exit, acc, marks, outside)`` for fast-path steps.
        self.store = store
        self.active = -1
        self.t_open: Any = None
        self.stack: list[int] = []
        self.in_step = 0
        self.implicit = implicit
        self.saw_opt = False
        self.marks: list = []
        #: Backward pieces dropped from an over-long zero-change step (``MAX_IMPLICIT_MARKS``).
        self.dropped_bwd = 0
        #: Zero-change mode: called with whether the next step begins now (a fetch or a
        #: forward), after each step it closes -- the FLOP count's and the counters' step
        #: boundaries (None once they have nothing left to do: nothing per step then).
        self.on_close: Callable[[bool], None] | None = None
        self.outside: list = []
        self.enter: Any = None
        self.last_opt_end: Any = None
        #: The tracer knows its device and clock (set once, at the first step).
        self.ready = False
        #: Host clock, ``ready`` and not ``implicit``: the timed wrappers take their inline fast
        #: path (one frame per phase, no tuples) instead of ``phase_begin``/``phase_end``.
        self.fast = False
        #: The open (or next) step's sums: host nanoseconds per phase timed by the fast path,
        #: dataloader nanoseconds before the step (``PRE``), DataLoader samples (``SAMPLES``).
        self.acc = list(ACC_ZERO)
        #: A loader ran out (StopIteration) between steps: what had been fetched since the last
        #: step then (dataloader ns, samples, general-path fetches), on hold. Fetched for a loop
        #: that ended (an evaluation's), it is forgotten at the next fetch; but a loader that
        #: fetches one batch ahead (accelerate's, so the HF Trainer's) runs out while the
        #: training loop still has that batch to train on -- the next step begins with no
        #: fetch in between, and keeps it. ``fast`` is off while one is held, so the fast
        #: path never looks at it.
        self.loop_end: tuple[int, int, int, int] | None = None
        #: The iterator (its id: no reference that would keep its workers alive) whose first
        #: fetch since the last step went the general way (a new iterator's always does), and
        #: what had been fetched before it then (dataloader ns, samples, general-path
        #: fetches): an evaluation's loop that runs out took only its own fetches, not the
        #: training batch fetched before it (``_loop_ended``).
        self.began_fetching: tuple[int, int, int, int] | None = None
        #: Samples of a batch a loader fetched ahead, in an earlier step, for a step that
        #: trained on it after the loader ran out (0: none). The next epoch's first step
        #: fetches one batch ahead again and evens it out; a run that ends first is one batch
        #: short, which ``Tracer`` adds back. ``fast`` is off while it is held.
        self.ahead = 0

    # -- settings ------------------------------------------------------------------------
    def set_ready(self, host: bool) -> None:
        """The tracer knows its clock: on the host clock the fast path may run."""
        self.ready = host
        self.fast = host and not self.implicit and self.loop_end is None and not self.ahead

    def use_clock(self, mark: Callable[[], Any]) -> None:
        """Switch to another clock (device events) before any step: host marks cannot be mixed
        with events, so everything open starts clean."""
        self.mark = mark
        self.outside = []
        self.marks = []
        self.enter = None
        self.acc = list(ACC_ZERO)
        self.loop_end = None
        self.began_fetching = None
        self.ahead = 0
        self._reset_phases()

    def stop(self) -> None:
        """Tracing stopped (an internal error): the open step is dropped, wrappers take the
        general path and the step scope records nothing more."""
        self.fast = False
        self.in_step = 0
        self.loop_end = None
        self.began_fetching = None
        self.ahead = 0
        self.ready = False  # nothing turns the fast path back on
        self._reset_phases()

    def _reset_phases(self) -> None:
        self.active = -1
        self.stack = []

    # -- phases (the general path: any clock, zero-change mode, hooks) -------------------
    def phase_begin(self, p: int) -> None:
        prev = self.active
        self.stack.append(prev)
        if prev in ABSORBED_BY[p]:
            return
        t = self.mark()
        if prev >= 0:
            self.record(prev, self.t_open, t)  # suspend the open phase
        elif self.implicit:
            if self.saw_opt and p in (DL, FWD):
                self._close_implicit(t)
                if self.on_close is not None:
                    self.on_close(True)
                t = self.mark()  # a fresh mark: a device event must belong to one step only
            if self.enter is None:
                self.enter = t
        self.active = p
        self.t_open = t

    def phase_end(self, p: int) -> None:
        stack = self.stack
        if not stack:  # its begin was before a reset (a new step, a clock switch)
            return
        prev = stack.pop()
        a = self.active
        if prev in ABSORBED_BY[p] or (a != p and a != ENDS_WITH[p]):
            return
        t = self.mark()
        self.record(a, self.t_open, t)
        self.active = prev
        self.t_open = t  # the suspended phase, if any, resumes now
        if p == OPT:
            self.saw_opt = True
            self.last_opt_end = t

    def phase_abort(self, p: int, batch: int = 0, it: Any = None) -> None:
        """The phase ended without a result (a loader's StopIteration, ``batch``: its samples
        per batch, ``it``: the iterator): record nothing, and forget fetches since the last
        step -- they belonged to a loop that just ended (``_loop_ended``)."""
        stack = self.stack
        if stack:
            prev = stack.pop()
            if self.active == p and prev not in ABSORBED_BY[p]:
                self.active = prev  # from t_open: the failed fetch counts to what it was in
        if not self.in_step:
            self._loop_ended(batch, it)

    def _forget_outside(self) -> None:
        self.outside.clear()
        acc = self.acc
        acc[PRE] = acc[SAMPLES] = 0

    def _loop_ended(self, batch: int, it: Any = None) -> None:
        """A loader ran out between steps: hold what was fetched since the last step until the
        next fetch (forget it) or step (keep it) tells whose it was (see ``loop_end``).

        Without grad (``torch.no_grad``, ``inference_mode``) no training step trains on what
        it fetched: an evaluation's loop ended, and its fetches are forgotten at once -- from
        its first, where it began fetching since the last step, so that a training batch
        fetched before the evaluation stays the next step's."""
        if self.implicit:  # zero-change steps hold their fetches in the open step: forget
            self._forget_outside()
            return
        self._settle_loop_end(False)  # an earlier loop's, run out in turn
        acc = self.acc
        if not _grad_enabled():
            began = self.began_fetching
            if began is not None and began[0] == id(it):
                self._forget_since(began[1], began[2], began[3])
            else:
                self._forget_outside()
            self.began_fetching = None
            return
        self.loop_end = (acc[PRE], acc[SAMPLES], len(self.outside), batch)
        self.fast = False

    def _forget_since(self, pre: int, samples: int, fetches: int) -> None:
        """Forget what was fetched since the loader sums were ``pre``, ``samples`` and
        ``fetches``."""
        acc = self.acc
        acc[PRE] = min(acc[PRE], pre)
        acc[SAMPLES] = min(acc[SAMPLES], samples)
        del self.outside[fetches:]

    def began_fetch(self, it: Any) -> None:
        """General path, between steps: ``it`` fetches; note where it began (``began_fetching``)."""
        began = self.began_fetching
        if began is None or began[0] != id(it):
            acc = self.acc
            self.began_fetching = (id(it), acc[PRE], acc[SAMPLES], len(self.outside))

    def _settle_loop_end(self, keep: bool) -> None:
        held = self.loop_end
        if held is None:
            return
        self.loop_end = None
        pre, samples, n, batch = held
        if keep:  # the step trains on a batch fetched ahead, in the step before
            self.ahead = batch
        else:
            acc = self.acc
            acc[PRE] -= pre
            acc[SAMPLES] -= samples
            del self.outside[:n]
        self.fast = self.ready and not self.implicit and not self.ahead

    def _step_fetched(self) -> None:
        """A step begins with batches fetched for it: after an epoch that ended on a batch
        fetched ahead, the new epoch fetches one ahead again -- the two even out."""
        if self.acc[SAMPLES] or self.outside:
            self.ahead = 0
            self.fast = self.ready and not self.implicit

    def record(self, p: int, t0: Any, t1: Any) -> None:
        """Where a finished piece of a phase goes: the open step, or the fetches before the next."""
        if self.in_step or self.implicit:
            marks = self.marks
            marks.append((p, t0, t1))
            if len(marks) > MAX_IMPLICIT_MARKS and self.implicit:
                half = MAX_IMPLICIT_MARKS // 2
                self.dropped_bwd += sum(1 for m in marks[:half] if m[0] == BWD)
                del marks[:half]
        else:
            outside = self.outside
            outside.append((p, t0, t1))
            if len(outside) > MAX_OUTSIDE_FETCHES:
                del outside[0]

    def grads_ready(self) -> None:
        """Inside backward, a gradient DDP's reducer waits for became ready (a hook of
        tracer/waits.py on the parameters that are ready last): backward's time so far was its
        compute; from now until backward returns -- or the next such gradient, then this one
        was not the last -- it waits for the gradient all-reduce (``ENDS_WITH``). Called on
        autograd's thread while the training thread waits in backward."""
        a = self.active
        if a != BWD and a != WAIT:
            return
        t = self.mark()
        if self.fast and self.in_step:
            self.acc[BWD] += t - self.t_open
        else:
            self.record(BWD, self.t_open, t)
        self.t_open = t
        self.active = WAIT

    def optimizer_boundary(self) -> None:
        """A step boundary without an optimizer phase (GradScaler skipped optimizer.step())."""
        self.saw_opt = True

    # -- the timed wrappers (fast path inline) ------------------------------------------
    def _suspend(self, prev: int, t: Any) -> None:
        """Fast path: a phase begins inside ``prev``; ``prev``'s time so far is its own."""
        if self.in_step:
            self.acc[prev] += t - self.t_open
        else:
            self.record(prev, self.t_open, t)

    def timed(
        self,
        orig: Callable[..., Any],
        p: int,
        fail: Fail,
        before: Callable[[tuple], None] | None = None,
    ) -> Callable[..., Any]:
        """``orig`` timed as phase ``p``.

        The common case -- host clock, tracing settled -- is inlined: one Python frame per
        phase and an integer addition, which is most of what tracing costs a small step; a
        phase it suspends is kept in this frame, not on ``stack``. Everything else (device
        clocks, zero-change mode, the first step) goes through ``phase_begin``/``phase_end``.
        ``before`` runs on the general path only, i.e. until the tracer knows its device.
        """
        rec = self
        absorbed = ABSORBED_BY[p]
        ends = (p, ENDS_WITH[p])  # the phases this call may end: p, and backward's wait

        def general(args: tuple, kwargs: dict) -> Any:
            try:
                if before is not None:
                    before(args)
                rec.phase_begin(p)
            except Exception as exc:
                fail(exc)
            try:
                return orig(*args, **kwargs)
            finally:
                try:
                    rec.phase_end(p)
                except Exception as exc:
                    fail(exc)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not rec.fast:
                return general(args, kwargs)
            prev = rec.active
            if prev in absorbed:  # counted once, to the phase already open
                return orig(*args, **kwargs)
            try:
                t0 = rec.mark()
                if prev >= 0:
                    rec._suspend(prev, t0)
                rec.active = p
                rec.t_open = t0
            except Exception as exc:
                fail(exc)
                return orig(*args, **kwargs)
            try:
                return orig(*args, **kwargs)
            finally:
                try:
                    a = rec.active
                    if a in ends:  # else the state was reset under us
                        t1 = rec.mark()
                        if rec.in_step:
                            rec.acc[a] += t1 - rec.t_open  # host nanoseconds
                        else:
                            rec.record(a, rec.t_open, t1)
                        rec.active = prev
                        rec.t_open = t1
                except Exception as exc:
                    fail(exc)

        return wrapper

    def timed_next(
        self, orig: Callable[[Any], Any], fail: Fail, first_batch: Callable[[Any, Any], int]
    ) -> Callable[[Any], Any]:
        """A DataLoader iterator's ``__next__`` timed as the dataloader phase, on the thread
        that created it (a prefetch thread is not the training loop). A fetch that raises
        (StopIteration: the loop ended) records nothing.

        Each fetch adds the iterator's samples per batch to the step's count. That number is
        read once per iterator, after its first fetch and outside the phase, by
        ``first_batch(iterator, batch)``, and kept on the iterator as ``SAMPLES_ATTR`` (its
        class default, None, sends a new iterator down the general path once)."""
        rec = self
        owner = threading.get_ident()
        get_ident = threading.get_ident
        absorbed = ABSORBED_BY[DL]

        def general(it: Any) -> Any:
            if get_ident() != owner:
                return orig(it)
            try:
                if not rec.in_step and not rec.implicit:
                    if rec.loop_end is not None:
                        rec._settle_loop_end(False)  # the loader that ran out: another loop's
                    rec.began_fetch(it)
                rec.phase_begin(DL)
            except Exception as exc:
                fail(exc)
            try:
                batch = orig(it)
            except BaseException:  # StopIteration included: the loop ended
                try:
                    rec.phase_abort(DL, getattr(it, SAMPLES_ATTR, None) or 0, it)
                except Exception as exc:  # never in place of the loader's own exception
                    fail(exc)
                raise
            try:
                rec.phase_end(DL)
                n = getattr(it, SAMPLES_ATTR, None)
                if n is None:
                    n = first_batch(it, batch)
                    setattr(it, SAMPLES_ATTR, n)
                rec.acc[SAMPLES] += n
            except Exception as exc:
                fail(exc)
            return batch

        def __next__(it: Any) -> Any:
            n = it._traceml_ci_samples  # SAMPLES_ATTR
            if n is None or not rec.fast or get_ident() != owner:
                return general(it)
            # timed()'s inlined opening again, on purpose: a shared helper is a frame per batch.
            prev = rec.active
            if prev in absorbed:
                return orig(it)
            try:
                t0 = rec.mark()
                if prev >= 0:
                    rec._suspend(prev, t0)
                rec.active = DL
                rec.t_open = t0
            except Exception as exc:
                fail(exc)
                return orig(it)
            try:
                batch = orig(it)
            except BaseException:
                try:
                    if rec.active == DL:
                        rec.active = prev
                        if not rec.in_step:
                            rec._loop_ended(n, it)
                except Exception as exc:  # never in place of the loader's own exception
                    fail(exc)
                raise
            try:
                acc = rec.acc
                if rec.active == DL:
                    t1 = rec.mark()
                    # In the step, or (the usual place) before it.
                    acc[DL if rec.in_step else PRE] += t1 - rec.t_open
                    rec.active = prev
                    rec.t_open = t1
                acc[SAMPLES] += n
            except Exception as exc:
                fail(exc)
            return batch

        return __next__

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
        if self.loop_end is not None:
            self._settle_loop_end(True)  # a loader that fetched ahead: its batch is this step's
        elif self.ahead:
            self._step_fetched()
        self.began_fetching = None
        self.in_step = 1
        if self.active != -1:  # a phase left open (no phase of the general path is open
            self._reset_phases()  # without ``active`` set)
        self.enter = self.mark()

    def step_end(self, ok: bool = True) -> None:
        """Close the step: the exit mark first, so that handing it over is in no step."""
        in_step = self.in_step
        if in_step != 1:
            if in_step:
                self.in_step = in_step - 1
            return
        t = self.mark()
        self.in_step = 0
        if self.active != -1:
            self._reset_phases()
        acc = self.acc
        self.acc = [0, 0, 0, 0, 0, 0, 0, 0]  # ACC_ZERO
        marks, outside = self.marks, self.outside
        if self.fast:  # the store reads these at once: empty lists can stay
            if marks:
                self.marks = []
            if outside:
                self.outside = []
            if ok:
                self.store.host_step(self.enter, t, acc, marks, outside)
        else:  # device events are resolved later: every step gets its own lists
            self.marks, self.outside = [], []
            if ok:  # (the host clock's fast path may have fetched before it: ``PRE``)
                self.store(self.enter, t, marks, outside, acc[SAMPLES], acc[PRE])
        self.enter = None

    def _close_implicit(self, t: Any) -> None:
        marks, samples = self.marks, self.acc[SAMPLES]
        self.marks = []
        self.acc[SAMPLES] = 0
        self.store(self.enter, t, marks, [], samples)
        self.enter = None
        self.saw_opt = False

    def evaluation_begins(self) -> Any:
        """Zero-change mode: a forward of evaluation (a trained model, in eval mode, without
        grad) begins, outside any phase. The open step closes if its optimizer step is done;
        if it has trained nothing yet, its pieces so far were the evaluation's (a validation
        loader's fetches) and are dropped, so evaluation lies between steps. Returns the
        step's start mark in that case (where the evaluation began), else None."""
        if not self.implicit or self.active != -1 or self.enter is None:
            return None
        if self.saw_opt:
            self._close_implicit(self.mark())
            if self.on_close is not None:
                self.on_close(False)  # an evaluation follows, not a step
            return None
        if any(m[0] == BWD for m in self.marks):  # mid gradient accumulation: leave it be
            return None
        began, self.enter = self.enter, None
        self.marks = []
        self.acc[SAMPLES] = 0
        return began

    def flush(self) -> None:
        """At finish: close an open zero-change step at its last optimizer step."""
        if self.implicit and self.saw_opt and self.enter is not None:
            marks, samples = self.marks, self.acc[SAMPLES]
            self.marks = []
            self.acc[SAMPLES] = 0
            self.store(self.enter, self.last_opt_end, marks, [], samples)
            self.enter = None
            self.saw_opt = False


def _grad_enabled() -> bool:
    """torch's grad mode on this thread (True without torch loaded: nothing says otherwise)."""
    torch = sys.modules.get("torch")
    return True if torch is None else bool(torch.is_grad_enabled())


def wrap_forward(model: Any, rec: Recorder, fail: Fail) -> tuple[dict, str, bool, Any]:
    """Time ``model``'s outermost forward until ``unwrap_forward``: an instance attribute that
    shadows ``forward`` (or a compiled module's ``_compiled_call_impl``).

    Cheaper than module hooks (which force nn.Module's slow call path) and outside any
    torch.compile'd region, so it causes no graph break. It lives for one step only, and a
    ``copy.deepcopy(model)`` or ``torch.save(model)`` inside the step leaves it out
    (``tracer/transparency.py``).
    """
    d = model.__dict__
    key = "_compiled_call_impl" if d.get("_compiled_call_impl") is not None else "forward"
    had = key in d
    orig = d[key] if had else getattr(model, key)

    d[key] = rec.timed(orig, FWD, fail)
    return d, key, had, orig


class ForwardTimer:
    """``wrap_forward`` for one model, step after step, without building a wrapper each step:
    while the model has no instance ``forward`` and is not compiled in place, the same timed
    bound method is set and removed (two dict operations)."""

    __slots__ = ("model", "cls", "d", "func", "timed", "undo", "rec", "fail")

    def __init__(self, model: Any, rec: Recorder, fail: Fail) -> None:
        from traceml_ci.tracer.flops import compile_wrapper

        # The model torch.compile wrapped is timed from the wrapper: a shadow of its own
        # forward would be inside the compiled region (a graph break; fullgraph=True raises).
        wrapper = compile_wrapper(model)
        if wrapper is not None:  # (never ``or``: a module may define __len__ or __bool__)
            model = wrapper
        self.model = model
        self.cls = type(model)
        self.d = model.__dict__
        self.rec = rec
        self.fail = fail
        func = getattr(self.cls, "forward", None)
        bind = getattr(func, "__get__", None)
        self.timed = rec.timed(bind(model, self.cls), FWD, fail) if bind else None
        #: The class's forward while ``timed`` stands for it (else nothing is ever ``is`` it).
        self.func = func if bind else object()
        self.undo = (self.d, "forward", False, None)

    def wrap(self) -> tuple[dict, str, bool, Any]:
        d = self.d
        if (
            "forward" not in d
            and d.get("_compiled_call_impl") is None
            and self.cls.forward is self.func
        ):
            d["forward"] = self.timed
            return self.undo
        return wrap_forward(self.model, self.rec, self.fail)


def unwrap_forward(saved: tuple[dict, str, bool, Any]) -> None:
    d, key, had, orig = saved
    if had:
        d[key] = orig
    else:
        d.pop(key, None)


class StepGate:
    """The step boundaries of ``with trace_step(model):``, and its model's forward shadowed
    for the step (``ForwardTimer``): set before the enter mark and removed after the exit
    mark, so that the tracer's own per-step work lands in no step.

    Here is the short path (host clock, at most one model, tracing settled), with the
    recorder's ``step_begin``/``step_end`` inline: with one frame per phase in the timed
    wrappers, these two are most of what tracing costs a small step. A subclass
    (``session.StepScope``) supplies ``_enter``/``_exit``, the general way.
    """

    __slots__ = ("rec", "timer", "saved", "primed")

    def __init__(self, rec: Recorder, timer: ForwardTimer | None) -> None:
        self.rec = rec
        self.timer = timer
        #: The undo of the forward shadow: one tuple (a list of them for several models).
        self.saved: Any = None
        #: The short path may run: the general one did the run's first-step work, and the
        #: scope has at most one model (``saved`` is then never a list).
        self.primed = False

    def __enter__(self) -> StepGate:
        rec = self.rec
        if not rec.fast or rec.in_step or not self.primed:
            return self._enter()
        try:
            timer = self.timer
            if timer is not None:
                self.saved = timer.wrap()
            rec.in_step = 1  # (no check for a phase left open: the step's end clears it)
            rec.enter = rec.mark()
        except Exception as exc:
            self._fail(exc)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        rec = self.rec
        saved = self.saved
        if not rec.fast or rec.in_step != 1 or exc_type is not None or not self.primed:
            return self._exit(exc_type)
        try:
            t = rec.mark()
            if saved is not None:
                self.saved = None
                unwrap_forward(saved)
            rec.in_step = 0
            if rec.active != -1:
                rec._reset_phases()
            acc = rec.acc
            rec.acc = [0, 0, 0, 0, 0, 0, 0, 0]  # ACC_ZERO
            marks, outside = rec.marks, rec.outside
            if marks:  # the store reads these at once: empty lists can stay
                rec.marks = []
            if outside:
                rec.outside = []
            rec.store.host_step(rec.enter, t, acc, marks, outside)
        except Exception as err:
            self._fail(err)
        return False

    def _enter(self) -> StepGate:  # pragma: no cover - supplied by the subclass
        raise NotImplementedError

    def _exit(self, exc_type: Any) -> bool:  # pragma: no cover - supplied by the subclass
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:  # pragma: no cover - supplied by the subclass
        raise NotImplementedError
