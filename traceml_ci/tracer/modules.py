"""Per-module forward and backward time, sampled: which submodule of the traced model holds the
forward time and the backward time.

Hooks on every module of every step would cost a small step dearly, so none are installed
between samples. About every ``every_s`` seconds of training (checked where the tracer already
samples RSS, ~10 times a second, never per step), between two steps, forward hooks are put on
up to ``MAX_MODULES`` submodules of the traced model (``select_modules``). They time that
step's forward with the phases' clock (host time, or device events on CUDA) and remove
themselves when the model's forward returns: one step in a sample, nothing on the others.

Backward, the same step: each timed call hangs a gradient hook on its output tensors (its
backward starts when the gradient of its output is ready) and on its input tensors that need
a gradient (it ends when theirs is). Tensor hooks leave the autograd graph as it is -- unlike
``register_full_backward_hook``, whose identity functions make a later in-place op on a
module's output raise in the user's step. A call whose inputs need no gradient (the first
layer) ends when the backward pass does. Where an input feeds other modules too, its gradient
is ready only after theirs: that call's backward then includes them (docs/pinpoint.md).

Times are inclusive (a module's time holds its children's); shares are of the model's own
forward / backward in the same sampled steps. Each instant of a sampled step is given to one
module and its ancestors only -- the timed call that began last among those running then
(``attribute``) -- so a child never exceeds its parent and siblings never add up to more than
their parent, even where backward intervals overlap (an input several modules read, hooks
firing on one tensor in turn). On the host clock the hooks' own work is timed and left out,
of the modules and of the model's own time alike, and so is their cost that no mark sees
(torch calling them, their return, ops slowed by a tensor's gradient hook): measured once per
run on a hooked probe module (``calibrate``). What that probe, called in a hot loop, still
misses (cold caches in a real model: 1-2x the calibrated cost, per machine) is measured in the
run itself: a step after each sample times the model's forward unhooked, and the hooks'
cost is scaled until the sampled forwards take what those do (``leak_scale``). A sampled step is
slower than the others by that work, and shares are of the step as it runs unsampled. The
thread's waits for a CPU, read in every hook (schedstat), are left out where they fell -- a
preemption would land in one module -- and clean samples are preferred (``keep_samples``).
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from traceml_ci.summary.keys import DEFAULT_MODULE_SAMPLE_S, TOP_MODULES
from traceml_ci.summary.stats import iqr
from traceml_ci.tracer.clocks import HostClock
from traceml_ci.tracer.contention import ThreadWait
from traceml_ci.tracer.flops import compile_in_use, compiled_frames
from traceml_ci.tracer.handles import held_weakly, remove_all

#: Seconds of training between two sampled steps (``init(module_sample_s=...)``; 0: off).
SAMPLE_EVERY_S = DEFAULT_MODULE_SAMPLE_S
#: Submodules timed at most: whole levels of the module tree, breadth first, while they fit.
MAX_MODULES = 32
#: Per-sample shares kept per module for the noise estimate (a reservoir beyond that).
MAX_SHARES = 512
#: Module names longer than this are cut (names are keys between runs; cut the same way).
MAX_NAME = 160
#: Tensors looked at in one call's inputs or outputs.
MAX_TENSORS = 8
#: At most one step in this many is sampled: a sampled step is a little slower, and the
#: phases' medians stay those of unsampled steps (a 20 ms sample period on 10 ms steps).
MIN_STEP_GAP = 4
#: Between-step housekeeping never runs more often than this, whatever the sample period.
MIN_TICK_NS = 1_000_000
#: Samples whose device events are not done yet: older ones are waited for.
MAX_PENDING = 4

#: A sample whose thread waited for a CPU more than this fraction of its time is not clean.
PREEMPTED_FRACTION = 0.05
#: Without a runqueue-wait reading (no schedstats; device clocks), a sample that ran this
#: fraction of its time beyond the median sample is left out: a preemption lands in whichever
#: module ran then -- one preempted 2 ms backward gave one of six identical layers 55 % of
#: backward (issue #23). With a reading, the wait is left out where it happened instead.
SLOW_FRACTION = 0.25
#: The clean samples alone are used when they are at least this fraction of all, and at
#: least ``MIN_KEPT`` (a noise estimate needs four); else see ``keep_samples``. Half: a few
#: clean samples of a loaded run are noisy, and can still start on cold caches.
MIN_KEPT_FRACTION = 0.5
MIN_KEPT = 4
#: Calls of a hooked no-op module, once per run, that measure the hooks' cost their own marks
#: do not see (medians: a preempted call does not count).
CALIBRATION_CALLS = 100
#: The unhooked forward is timed this many steps after a sampled one (before the next sample,
#: ``MIN_STEP_GAP`` on): not the very next, which may still pay the sample's backward hooks.
PLAIN_AFTER_STEPS = 2
#: The sampled forwards' excess over the unhooked ones is trusted up to this fraction of
#: them; beyond, the two are not alike (a forward that changes with the step) and it is not
#: used.
MAX_EXCESS_FRACTION = 0.5
#: The hooks' cost found in the run is at most this many times the calibrated one (measured
#: 1.0-1.8 quiet; beside other work, the forwards that follow a preemption run slower for
#: reasons of their own, and a larger cost, left out of every call, would leave small modules
#: only their noise); found to this many halvings of the interval (``leak_scale``).
MAX_LEAK_SCALE = 2.0
LEAK_SCALE_STEPS = 12

#: Armed steps in a row without the model's own forward before sampling stops.
MAX_MISSED = 3
#: ``modules.off`` when the traced model's forward is never called.
OFF_NO_FORWARD = (
    "the traced model's own forward never ran in a sampled step (its submodules "
    "were called directly): pass trace_step the module whose forward runs"
)
#: ``modules.off`` when torch.compile is in use.
OFF_COMPILED = (
    "torch.compile in use: submodules run inside compiled graphs, and hooks on them would recompile"
)


def select_modules(model: Any, limit: int = MAX_MODULES) -> list[tuple[str, Any]]:
    """The model's submodules, breadth first by whole levels while they fit in ``limit`` (the
    first level is cut to ``limit``). Entries of an ``nn.ModuleList`` / ``nn.ModuleDict`` count
    at the container's level (a container is never called itself)."""
    try:
        from torch import nn
    except Exception:
        return []
    containers = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)
    seen = {id(model)}
    chosen: list[tuple[str, Any]] = []
    level = _flatten_containers([("", model)], containers, seen)
    first = True
    while level:
        if len(chosen) + len(level) > limit:
            if first:
                chosen.extend(level[:limit])
            break
        chosen.extend(level)
        first = False
        level = _flatten_containers(level, containers, seen)
    return [(name[:MAX_NAME], module) for name, module in chosen]


def _flatten_containers(
    parents: list[tuple[str, Any]], containers: tuple[type, ...], seen: set[int]
) -> list[tuple[str, Any]]:
    """The children of ``parents``, in order, with containers replaced by their entries."""
    out: list[tuple[str, Any]] = []

    def visit(prefix: str, module: Any) -> None:
        for name, child in module.named_children():
            if id(child) in seen:  # one module at two places: timed where first seen
                continue
            seen.add(id(child))
            full = f"{prefix}.{name}" if prefix else name
            if isinstance(child, containers):
                visit(full, child)
            else:
                out.append((full, child))

    for prefix, module in parents:
        visit(prefix, module)
    return out


def _tensors(obj: Any) -> Iterator[Any]:
    """Tensors that need a gradient among a call's arguments or outputs (two levels deep:
    tensors, tuples/lists/dicts of them, as HF's ModelOutput)."""
    try:
        import torch
    except Exception:
        return

    def walk(o: Any, depth: int) -> Iterator[Any]:
        if isinstance(o, torch.Tensor):
            if o.requires_grad:
                yield o
        elif depth < 2:
            items = o.values() if isinstance(o, dict) else o if isinstance(o, (tuple, list)) else ()
            for x in items:
                yield from walk(x, depth + 1)

    for n, t in enumerate(walk(obj, 0), 1):
        yield t
        if n >= MAX_TENSORS:
            return


def merged_gaps(root_ms: float, gaps: Sequence[tuple[float, float]]) -> list[list[float]]:
    """``gaps`` clipped to ``[0, root_ms]``, sorted, and merged where they touch."""
    holes: list[list[float]] = []
    for s, e in sorted((max(s, 0.0), min(e, root_ms)) for s, e in gaps):
        if e <= s:
            continue
        if holes and s <= holes[-1][1]:
            holes[-1][1] = max(holes[-1][1], e)
        else:
            holes.append([s, e])
    return holes


def attribute(
    root_ms: float,
    calls: Sequence[tuple[str, float, float]],
    ancestors: Mapping[str, tuple[str, ...]],
    gaps: Sequence[tuple[float, float]] = (),
) -> tuple[float, dict[str, float]]:
    """One sampled direction's time per module: ``calls`` are ``(name, start, end)`` in ms
    from the model's own start, ``root_ms`` its own length, ``gaps`` the hooks' own work.

    Each instant in ``[0, root_ms]`` outside the gaps goes to the call that began last among
    those running then, and to its module's timed ``ancestors`` -- to one chain of the module
    tree. So, whatever the marks: a module's time is at most its parent's, siblings add up to
    at most their parent's, and the top level to at most the model's. Properly nested calls
    (every forward) keep their own lengths; overlapping backward intervals are split where
    the later one begins. Returns the model's time less the gaps, and the modules' times."""
    root_ms = max(root_ms, 0.0)
    spans = sorted(
        (max(s, 0.0), min(e, root_ms), i, name)
        for i, (name, s, e) in enumerate(calls)
        if min(e, root_ms) > max(s, 0.0)
    )
    holes = merged_gaps(root_ms, gaps)
    points = sorted(
        {0.0, root_ms, *(x for sp in spans for x in sp[:2]), *(x for h in holes for x in h)}
    )
    out: dict[str, float] = {}
    # Running calls, the one that began last on top; of two that began together, the one that
    # ends first (the inner one), then the deeper module.
    active: list[tuple[float, float, int, int, str]] = []  # (-start, end, -depth, -order, name)
    gap_ms = 0.0
    nxt = hole = 0
    for a, b in zip(points, points[1:], strict=False):
        while nxt < len(spans) and spans[nxt][0] <= a:
            s, e, i, name = spans[nxt]
            heapq.heappush(active, (-s, e, -len(ancestors.get(name, ())), -i, name))
            nxt += 1
        while hole < len(holes) and holes[hole][1] <= a:
            hole += 1
        if hole < len(holes) and holes[hole][0] <= a:  # [a, b] lies in that gap
            gap_ms += b - a
            continue
        while active and active[0][1] <= a:  # ended: not running any more
            heapq.heappop(active)
        if not active:
            continue
        name = active[0][4]
        out[name] = out.get(name, 0.0) + (b - a)
        for up in ancestors.get(name, ()):
            out[up] = out.get(up, 0.0) + (b - a)
    return root_ms - gap_ms, out


class _Sample:
    """One sampled step's marks. A call is ``[name, fwd0, fwd1, bwd0, bwd1, ends_with_pass,
    pre0, post1]`` (``pre0``/``post1``: where its pre hook's work began and its post hook's
    ended, host clock only); ``gaps``: the forward hooks' own work, ``[from, to]`` marks (host
    clock only); ``waits``: per direction, ``(mark, runqueue wait ns, mark, opens_gap)``
    readings of the thread's wait for a CPU, taken in the hooks (host clock with schedstats
    only; ``_wait_gaps``)."""

    __slots__ = ("calls", "root", "backward_done", "gaps", "waits")

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []
        self.root: list[Any] = [None, None, None, None]  # forward from/to, backward from/to
        self.backward_done = False
        self.gaps: list[list[Any]] = []
        self.waits: dict[str, list[tuple[Any, int, Any, bool]]] = {
            "forward": [],
            "backward": [],
        }


#: (pre-hook outside, pre-hook inside, post-hook inside, post-hook outside) ns per call.
Leak = tuple[float, float, float, float]


def _no_wait() -> int | None:
    return None


def keep_samples(samples: Sequence[tuple[float, float | None, Any]]) -> list[int]:
    """Indexes of the samples whose shares count: ``samples`` are ``(root_ms, waited_ms,
    ...)``, ``waited_ms`` what the thread waited for a CPU inside (already left out of
    ``root_ms`` and the modules; None: not read).

    Preferred: the clean ones, that waited at most ``PREEMPTED_FRACTION`` of their time (a
    preempted thread comes back to cold caches, and its next work runs slower: measured,
    +0.5 ms of CPU time on a 3.5 ms forward). Without readings, a sample that ran
    ``SLOW_FRACTION`` of its time beyond the median is not clean. When fewer than
    ``MIN_KEPT_FRACTION`` of them (and ``MIN_KEPT``) are clean: those with readings are all
    kept (their waits are left out already), of the others the fastest that many."""
    if not samples:
        return []
    median = statistics.median(s[0] for s in samples)

    def score(s: tuple[float, float | None, Any]) -> float:
        root, waited = s[0], s[1]
        if root <= 0:
            return math.inf
        if waited is not None:
            return max(waited, 0.0) / root / PREEMPTED_FRACTION
        return max(root - median, 0.0) / root / SLOW_FRACTION

    scores = [score(s) for s in samples]
    kept = [i for i, x in enumerate(scores) if x <= 1.0]
    least = min(len(samples), max(MIN_KEPT, math.ceil(MIN_KEPT_FRACTION * len(samples))))
    if len(kept) >= least:
        return kept
    corrected = [i for i, s in enumerate(samples) if s[1] is not None]
    if len(corrected) >= least:
        return corrected
    return sorted(sorted(range(len(samples)), key=lambda i: scores[i])[:least])


class ModuleSampler:
    """Arms hooks for one step now and then; keeps each module's sampled times and shares."""

    def __init__(self, warn: Callable[[str], None], every_s: float = SAMPLE_EVERY_S) -> None:
        self._warn = warn
        #: Frames dynamo had compiled when this run began (see ``compile_in_use``).
        self.frames_before = compiled_frames()
        self.every_ns = int(every_s * 1e9)
        self.enabled = every_s > 0
        self.clock: Any = HostClock()
        #: The sampled model and its submodules, held weakly: a model the user drops (the
        #: next trial of a sweep) is freed as untraced, and sampling stops with it.
        self.model: Callable[[], Any] | None = None
        self.modules: list[tuple[str, Callable[[], Any]]] = []
        #: name -> class name (``4`` of a Sequential says little; ``4 (Linear)`` does).
        self.types: dict[str, str] = {}
        #: name -> the timed modules it sits in (``encoder`` for ``encoder.layer.3``).
        self.ancestors: dict[str, tuple[str, ...]] = {}
        self.handles: list[Any] = []
        self.next_ns = 0
        self.next_step = 0
        #: The step count when the hooks were armed, and armed steps in a row whose model
        #: forward never ran.
        self.armed_step = 0
        self.missed = 0
        #: Why sampling is off for this run (None: it is not).
        self.off_reason: str | None = None
        #: The hooks' cost their marks do not see, ns per call (``calibrate``; host clock).
        self.leak: Leak | None = None
        self._wait: ThreadWait | None = None
        self._rng = random.Random(0)
        self._current: _Sample | None = None
        self._pending: list[_Sample] = []
        #: The step from which the next unhooked forward is timed (None: none due), and
        #: whether the hooks armed now are that one's.
        self._plain_from: int | None = None
        self._plain_armed = False
        #: Unhooked forwards: (ms less the thread's waits, ms waited, None); a reservoir.
        self.plain: list[tuple[float, float | None, None]] = []
        self._plain_seen = 0
        # per direction: samples, and per sample (the model's ms, ms its thread waited for a
        # CPU, left out, or None, {module: ms}, a forward's marks or None: ``_Record``) -- a
        # reservoir of MAX_SHARES beyond that
        self.steps = {"forward": 0, "backward": 0}
        self.samples: dict[str, list[_Record]] = {
            "forward": [],
            "backward": [],
        }

    def set_every(self, every_s: float) -> None:
        """A later ``init(module_sample_s=...)``, before the first step: 0 turns sampling off."""
        self.every_ns = int(every_s * 1e9)
        self.enabled = every_s > 0 and self.off_reason is None

    def tick_ns(self, housekeeping_ns: int) -> int:
        """How often the step store should call ``tick``: its housekeeping interval, or half
        the sample period if shorter (a smoke test of a few hundred ms still gets samples, and
        each sample's unhooked forward a tick of its own between two samples)."""
        if not self.enabled or self.every_ns <= 0:
            return housekeeping_ns
        return max(min(housekeeping_ns, self.every_ns // 2), MIN_TICK_NS)

    @property
    def sampled(self) -> int:
        return self.steps["forward"]

    def watch(self, model: Any) -> None:
        """The model whose submodules are sampled (the first traced one)."""
        if self.model is not None or model is None or not self.enabled:
            return
        self.model = held_weakly(model)
        if compile_in_use((model,), self.frames_before):
            self._off(OFF_COMPILED)
            return
        modules = select_modules(model)
        self.modules = [(name, held_weakly(module)) for name, module in modules]
        self.types = {name: type(module).__name__[:MAX_NAME] for name, module in modules}
        names = [name for name, _ in self.modules]
        self.ancestors = {n: tuple(a for a in names if n.startswith(a + ".")) for n in names}
        if self.modules and self.clock.kind == "host":
            self._calibrate()  # now, before the first step: never in a step or between two

    def _calibrate(self) -> None:
        """The hooks' unmarked cost (``calibrate``, ~2 ms; tens under load), once per run."""
        try:
            self._wait = ThreadWait()
            self.leak = calibrate(self.clock.mark, self._wait.read)
        except Exception as exc:
            self.leak = None
            self._warn(f"module sampling: hook cost not measured ({exc!r})")

    def _off(self, reason: str) -> None:
        self.off_reason = reason
        self.enabled = False
        self._disarm()

    def tick(self, now_ns: int, step: int | None = None) -> None:
        """Between steps (where RSS is sampled): resolve finished samples, and arm the hooks
        for the next step when a sample is due. ``step``: steps recorded so far; at most one
        step in ``MIN_STEP_GAP`` is sampled, whatever the period."""
        if self._pending:
            self._resolve(wait=len(self._pending) > MAX_PENDING)
        if self.handles and step is not None and step > self.armed_step + 1:
            if self._plain_armed:  # no forward to compare with: not a missed sample
                self._disarm()
            else:
                self._missed_root()
        if not self.enabled or self.handles or not self.modules:
            return
        if self._released():
            return
        if self._plain_from is not None and step is not None and step >= self._plain_from:
            self._plain_from = None
            if self.clock.kind == "host" and self._wait is not None:
                self.armed_step = step
                self._plain_armed = self._arm_guarded(self._arm_plain)
                return
        if now_ns < self.next_ns:
            return
        if step is not None:
            if step < self.next_step:
                return
            self.armed_step = step
            self.next_step = step + MIN_STEP_GAP
        self.next_ns = now_ns + self.every_ns
        if compile_in_use((), self.frames_before):  # compiled since: leave its graphs alone
            self._off(OFF_COMPILED)
            return
        if self.clock.kind == "host" and self._wait is None:  # not calibrated at watch()
            self._calibrate()
        self._arm_guarded(self._arm)

    def _released(self) -> bool:
        """Whether the user let the sampled model go: then sampling stops, quietly (what was
        sampled stays in the summary)."""
        if self.model is not None and self.model() is not None:
            return False
        self.enabled = False
        self.modules = []
        return True

    def _model(self) -> Any:
        """The sampled model (alive: ``tick`` checked it just before arming)."""
        model = self.model() if self.model is not None else None
        if model is None:
            raise RuntimeError("the sampled model is gone")
        return model

    def _arm_guarded(self, arm: Callable[[], None]) -> bool:
        try:
            arm()
            return True
        except Exception as exc:
            self._disarm()
            self.enabled = False
            self._warn(f"module sampling stopped ({exc!r})")
            return False

    def _missed_root(self) -> None:
        """The armed step ended and the model's own forward never ran (a LightningModule whose
        training_step calls its submodules, say): drop the hooks; after a few such steps,
        stop sampling and say why."""
        self._disarm()
        self._current = None
        self.missed += 1
        if self.missed >= MAX_MISSED:
            self._off(OFF_NO_FORWARD)

    # -- one sampled step ----------------------------------------------------------------------
    def _arm(self) -> None:
        current = self._current
        if current is not None and current.root[1] is not None:  # its backward never came
            current.backward_done = False
            self._pending.append(current)
        sample = self._current = _Sample()
        mark = self.clock.mark
        # The thread's waits are host time: a device clock's samples never read them.
        host = self._wait is not None and self.clock.kind == "host"
        wait = self._wait.read if host and self._wait is not None else _no_wait
        guarded = self._guarded
        # The hooks' own work, left out of every time: host marks cost ~50 ns; device events
        # would time the device, which the hooks do not occupy.
        pre, post = module_hooks(sample, mark, guarded, self.clock.kind == "host", wait)
        for name, ref in self.modules:
            module = ref()
            if module is None:  # replaced by the user, and gone
                continue
            self.handles.append(module.register_forward_pre_hook(pre(name)))
            self.handles.append(module.register_forward_hook(post(name)))

        fwaits, bwaits = sample.waits["forward"], sample.waits["backward"]

        # Runqueue waits at the model's own marks are read outside them: in no time.
        def root_pre(module: Any, args: Any) -> None:
            w = wait()
            sample.root[0] = t = mark()
            if w is not None:
                fwaits.append((t, w, t, False))

        def backward_end() -> None:
            if self._current is not sample:  # a backward that came steps later: not counted
                return
            sample.root[3] = t = mark()
            w = wait()
            if w is not None:
                bwaits.append((t, w, t, False))
            sample.backward_done = True
            self._pending.append(sample)
            self._current = None

        def backward_start(grad: Any) -> None:
            if sample.root[2] is None:
                w = wait()
                sample.root[2] = t = mark()
                if w is not None:
                    bwaits.append((t, w, t, False))
                import torch

                torch.autograd.Variable._execution_engine.queue_callback(guarded(backward_end))

        def root_post(module: Any, args: Any, output: Any) -> None:
            if sample.root[0] is None:
                self._disarm()
                return
            sample.root[1] = t = mark()  # before the hooks go: removing them is no forward time
            w = wait()
            if w is not None:
                fwaits.append((t, w, t, False))
            self._disarm()  # one step's forward: the hooks go as it returns
            self.missed = 0
            if self.leak is not None and self.clock.kind == "host":  # compare it, unhooked
                self._plain_from = self.armed_step + PLAIN_AFTER_STEPS
            hooked = False
            for t in _tensors(output):
                t.register_hook(guarded(backward_start))
                hooked = True
            if not hooked:  # no backward through this output (eval, or no grad)
                self._pending.append(sample)
                self._current = None

        model = self._model()
        self.handles.append(model.register_forward_pre_hook(guarded(root_pre)))
        # Last among the model's post hooks: it removes them all.
        self.handles.append(model.register_forward_hook(guarded(root_post)))

    def _guarded(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> None:
            try:
                fn(*args)
            except Exception as exc:  # never into the user's step
                if self.enabled:
                    self._warn(f"module sampling stopped ({exc!r})")
                self.enabled = False

        return run

    def _arm_plain(self) -> None:
        """Time the model's own forward with its two hooks alone, the thread's waits left out:
        what a sampled forward would take without the module hooks. Not the next forward,
        the one after: the next follows this between-steps housekeeping, and ran 2-3 % slower
        than the steps around it (the sampled ones, all after housekeeping, pay that too,
        and it is left out with their hooks' cost)."""
        if self._wait is None:
            return
        mark, wait, el = self.clock.mark, self._wait.read, self.clock.elapsed_ms
        began: list[Any] = []
        skip = [True]

        def root_pre(module: Any, args: Any) -> None:
            if skip[0]:
                return
            w = wait()
            began[:] = [mark(), w]

        def root_post(module: Any, args: Any, output: Any) -> None:
            if skip[0]:
                skip[0] = False
                return
            t = mark()
            w = wait()
            self._disarm()
            if began and w is not None and began[1] is not None:
                waited = max(w - began[1], 0) / 1e6
                self._plain_seen += 1
                _reservoir(self.plain, (el(began[0], t) - waited, waited, None),
                           self._plain_seen, self._rng)

        model = self._model()
        self.handles.append(model.register_forward_pre_hook(self._guarded(root_pre)))
        self.handles.append(model.register_forward_hook(self._guarded(root_post)))

    def _disarm(self) -> None:
        self._plain_armed = False
        handles, self.handles = self.handles, []
        remove_all(handles)

    def stop(self) -> None:
        """At finish: no more samples; what was recorded is resolved (waiting on the device)."""
        self.enabled = False
        self._disarm()
        current, self._current = self._current, None
        if current is not None and current.root[1] is not None and current not in self._pending:
            self._pending.append(current)
        try:
            self._resolve(wait=True)
        except Exception as exc:
            self._warn(f"module sampling: the last samples were lost ({exc!r})")
            self._pending = []
        if self._wait is not None:
            self._wait.close()

    # -- resolving -----------------------------------------------------------------------------
    def _resolve(self, wait: bool) -> None:
        """Add up the samples whose marks are all done (device events complete lazily)."""
        clock = self.clock
        keep = []
        for sample in self._pending:
            marks = [m for m in _marks(sample) if m is not None]
            if not all(clock.ready(m) for m in marks):
                if not wait:
                    keep.append(sample)
                    continue
                for m in marks:
                    clock.wait(m)
            self._add(sample)
            for m in {id(m): m for m in marks}.values():
                clock.release(m)
        self._pending = keep

    def _add(self, sample: _Sample) -> None:
        """One sample's times: its marks as ms from the model's own start, each instant given
        to one chain of modules (``attribute``), the hooks' own work and the cost their marks
        do not see (``leak``) left out."""
        el = self.clock.elapsed_ms
        f0, f1, b0, b1 = sample.root
        if f0 is None or f1 is None:
            return
        backward = sample.backward_done and b0 is not None and b1 is not None
        leak = self.leak if self.clock.kind == "host" else None
        fwd: list[tuple[str, float, float]] = []
        bwd: list[tuple[str, float, float]] = []
        hooks: list[tuple[float, float, float | None, float | None]] = []
        gaps = [
            (el(f0, g0), el(f0, g1)) for g0, g1 in sample.gaps if g0 is not None and g1 is not None
        ]
        for name, c0, c1, d0, d1, ends_with_pass, p0, p1 in sample.calls:
            if c0 is not None and c1 is not None:
                s, e = el(f0, c0), el(f0, c1)
                fwd.append((name, s, e))
                hooks.append((s, e, None if p0 is None else el(f0, p0),
                              None if p1 is None else el(f0, p1)))
            end = b1 if ends_with_pass or d1 is None else d1
            if backward and d0 is not None and end is not None:
                bwd.append((name, el(b0, d0), el(b0, end)))
        fw = sample.waits["forward"]
        gaps += _wait_gaps(fw, f0, el)
        raw = _Forward(el(f0, f1), tuple(fwd), tuple(gaps), tuple(hooks))
        leak_ms = tuple(x / 1e6 for x in leak) if leak else (0.0,) * 4
        self._add_direction(
            "forward",
            *raw.attribute(self.ancestors, leak_ms),
            _waited_ms(fw),
            raw if leak else None,
        )
        if backward:
            bw = sample.waits["backward"]
            self._add_direction(
                "backward",
                *attribute(el(b0, b1), bwd, self.ancestors, _wait_gaps(bw, b0, el)),
                _waited_ms(bw),
            )

    def _add_direction(
        self,
        direction: str,
        root_ms: float,
        per_module: dict[str, float],
        waited_ms: float | None = None,
        raw: _Forward | None = None,
    ) -> None:
        """Keep one sample: ``root_ms`` the model's own time, ``per_module`` the modules'
        (``attribute``: each at most its parent's, siblings at most their parent's);
        ``waited_ms``: the thread's waits for a CPU, left out of both (None: not read);
        ``raw``: a forward's marks, attributed again at the end with the hooks' cost as the
        run measured it (``leak_scale``; None: as it is)."""
        if root_ms <= 0:
            return
        self.steps[direction] += 1
        record = (root_ms, waited_ms, per_module, raw)
        _reservoir(self.samples[direction], record, self.steps[direction], self._rng)

    def summary(self) -> dict[str, Any] | None:
        """The ``modules`` block (docs/pinpoint.md); None when sampling never ran."""
        if self.off_reason is not None:
            return {"sampled_steps": 0, "off": self.off_reason, "forward": []}
        n = self.steps["forward"]
        forward = self._direction("forward")
        if not n or forward is None:
            return None
        out: dict[str, Any] = {
            "sampled_steps": n,
            "every_s": self.every_ns / 1e9,
            "clock": self.clock.kind,
            "forward_ms": forward[0],
            "forward_left_out": forward[1],
            "forward": forward[2],
        }
        backward = self._direction("backward")
        if self.steps["backward"] and backward is not None:
            out["backward_steps"] = self.steps["backward"]
            out["backward_ms"] = backward[0]
            out["backward_left_out"] = backward[1]
            out["backward"] = backward[2]
        return out

    def _direction(self, direction: str) -> tuple[float, int, list[dict[str, Any]]] | None:
        """One direction over its kept samples (``keep_samples``): the model's mean ms, how
        many samples were left out, and the slowest modules' rows. Ratios of sums over whole
        samples, so what ``attribute`` promises of each sample holds of the whole."""
        samples = self.samples[direction]
        kept = [samples[i] for i in keep_samples(samples)]
        scale = self.leak_scale(kept) if direction == "forward" else 1.0
        if scale > 1.0 and self.leak:
            leak_ms = tuple(scale * x / 1e6 for x in self.leak)
            kept = [_attributed_again(r, self.ancestors, leak_ms) for r in kept]
            kept = [r for r in kept if r[0] > 0]  # as ``_add_direction`` keeps them
        root = sum(r for r, *_ in kept)
        if not kept or root <= 0:
            return None
        totals: dict[str, float] = {}
        for _, _, per_module, _ in kept:
            for name, ms in per_module.items():
                totals[name] = totals.get(name, 0.0) + ms
        top = sorted(totals.items(), key=lambda kv: -kv[1])[:TOP_MODULES]
        rows = []
        for name, ms in top:
            shares = [100.0 * pm.get(name, 0.0) / r for r, _, pm, _ in kept]
            row = {
                "name": name,
                "type": self.types.get(name, ""),
                "ms": round(ms / len(kept), 4),
                "share_pct": round(100.0 * ms / root, 2),
            }
            if len(shares) >= 4:  # per-sample spread of the share: the gate's noise rule for
                row["noise_pp"] = round(iqr(shares), 2)  # modules (absent: too few samples)
            rows.append(row)
        return round(root / len(kept), 4), len(samples) - len(kept), rows

    def leak_scale(self, kept: Sequence[_Record]) -> float:
        """How many times the calibrated hook cost (``leak``) a sampled forward of this run
        pays: the sampled forwards (``kept``, their hooks' marked work and calibrated cost left
        out) against the unhooked ones of the same run (``_arm_plain``), their difference
        spread over every hooked call as the calibrated cost is. A probe called in a hot loop
        misses what a real model's calls pay on colder caches: measured 1.0-1.8 times it. Both
        sides are picked alike: the clean ones where each has ``MIN_KEPT`` (a preempted
        forward runs slower after its wait, on cold caches), else all, their waits left out;
        and compared by their medians (a stall in one sample, not the hooks', would move a
        mean, and the cost left out of every call with it). 1.0 where either side is
        missing, the sampled forwards are not slower, or the two are not alike
        (``MAX_EXCESS_FRACTION``)."""
        counted = [r for r in kept if r[3]]
        plain: Sequence[tuple[float, float | None, Any]] = self.plain
        clean_sampled, clean_plain = _clean(counted), _clean(plain)
        if len(clean_sampled) >= MIN_KEPT and len(clean_plain) >= MIN_KEPT:
            counted, plain = clean_sampled, clean_plain
        if not self.leak or len(counted) < MIN_KEPT or len(plain) < MIN_KEPT:
            return 1.0
        leak_ms = [x / 1e6 for x in self.leak]
        sampled = statistics.median(r[0] for r in counted)
        unhooked = statistics.median(p[0] for p in plain)
        if not 0 < sampled - unhooked <= MAX_EXCESS_FRACTION * sampled or not any(leak_ms):
            return 1.0

        def left(scale: float) -> float:  # the sampled forwards' median, less that much cost
            cost = [scale * x for x in leak_ms]
            return statistics.median(r[3].root_less(cost) for r in counted if r[3])

        # Where gaps meet, more cost leaves out less time: bisect for the scale at which the
        # sampled forwards take what the unhooked ones do.
        low, high = 1.0, 2.0
        while left(high) > unhooked and high < MAX_LEAK_SCALE:
            low, high = high, 2 * high
        for _ in range(LEAK_SCALE_STEPS):
            mid = (low + high) / 2
            low, high = (mid, high) if left(mid) > unhooked else (low, mid)
        return min(high, MAX_LEAK_SCALE)


def module_hooks(
    sample: _Sample,
    mark: Callable[[], Any],
    guarded: Callable[[Callable[..., Any]], Callable[..., Any]],
    host: bool,
    wait: Callable[[], int | None] = _no_wait,
) -> tuple[Callable[[str], Callable[..., None]], Callable[[str], Callable[..., None]]]:
    """Makers of a module's pre- and post-forward hooks that stamp its calls into ``sample``
    (``host``: the hooks' own work is stamped too, as ``sample.gaps``; ``wait``: the thread's
    runqueue wait, read inside that work, into ``sample.waits``)."""
    calls = sample.calls
    gaps = sample.gaps if host else None
    fwaits, bwaits = sample.waits["forward"], sample.waits["backward"]
    opened: dict[str, list[list[Any]]] = {}  # a module's calls not returned yet

    def pre(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            g0 = mark() if gaps is not None else None
            w = wait()  # at both ends of the hook's work: a wait inside it is left out once
            if w is not None:
                fwaits.append((g0, w, g0, True))
            call = [name, None, None, None, None, True, g0, None]
            calls.append(call)
            for t in _tensors(args):
                call[5] = False
                t.register_hook(guarded(lambda grad, c=call: _set_end(c, mark, wait, bwaits)))
            opened.setdefault(name, []).append(call)
            w = wait()
            call[1] = mark()  # the call starts as its hook's work ends
            if gaps is not None:
                gaps.append([g0, call[1]])
                if w is not None:
                    fwaits.append((call[1], w, call[1], False))

        return guarded(hook)

    def post(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            end = mark()  # the call ends as its hook's work begins
            open_calls = opened.get(name)
            if not open_calls:
                return
            call = open_calls.pop()
            call[2] = end
            w = wait()
            if w is not None:
                fwaits.append((end, w, end, True))
            for t in _tensors(output):
                t.register_hook(guarded(lambda grad, c=call: _set_start(c, mark, wait, bwaits)))
            if gaps is not None:
                w = wait()
                call[7] = mark()
                gaps.append([end, call[7]])
                if w is not None:
                    fwaits.append((call[7], w, call[7], False))

        return guarded(hook)

    return pre, post


def _waited_ms(readings: list[tuple[Any, int, Any, bool]]) -> float | None:
    """What the thread waited for a CPU from its first reading to its last (None: none)."""
    if not readings:
        return None
    waits = [r[1] for r in readings]
    return max(max(waits) - min(waits), 0) / 1e6


def _wait_gaps(
    readings: list[tuple[Any, int, Any, bool]], origin: Any, el: Callable[[Any, Any], float]
) -> list[tuple[float, float]]:
    """The thread's waits for a CPU as gaps, ms from ``origin``: ``readings`` are ``(mark,
    wait ns, mark, opens_gap)``, a reading taken between the two marks (its own cost, a gap
    too). What it waited between two readings lies between them, in time that belongs to one
    chain of modules (readings are taken in every hook): it is left out right after the
    first -- unless the first opens a hook's work (``opens_gap``), left out already."""
    out: list[tuple[float, float]] = []
    last: tuple[Any, int, Any, bool] | None = None
    for r in sorted(readings, key=lambda r: el(origin, r[0])):
        a, b = el(origin, r[0]), el(origin, r[2])
        if b > a:
            out.append((a, b))
        if last is not None and r[1] > last[1] and not last[3]:
            start = el(origin, last[2])
            out.append((start, min(start + (r[1] - last[1]) / 1e6, a)))
        last = r
    return out


def calibrate(
    mark: Callable[[], Any],
    wait: Callable[[], int | None] = _no_wait,
    calls: int = CALIBRATION_CALLS,
) -> Leak | None:
    """The hooks' per-call cost that their own marks do not see, in clock units (host ns):
    torch calling the pre hook and the hook's return (before and after its work's marks),
    the same for the post hook -- as ``(pre outside, pre inside, post inside, post outside)``
    the call's interval, each beyond what calling an unhooked module costs -- and, added to
    the inside of the pre hook and the outside of the post hook, how much slower an op runs
    on a tensor carrying a gradient hook (the first op on the call's input, and on its
    output). Measured as a real call runs: a module whose input and output need a gradient
    (so the hooks hang their gradient hooks, and read ``wait``), whose forward marks its own
    start and end around one op; medians of ``calls`` calls each way (~2 ms in all, once per
    run). None where it cannot be measured."""
    try:
        import torch
        from torch import nn
    except Exception:
        return None
    seen: list[Any] = []

    class Probe(nn.Module):
        def forward(self, x: Any) -> Any:
            seen.append(mark())
            y = x.add(0.0)
            seen.append(mark())
            return y

    plain_probe, probe = Probe(), Probe()
    leaf = torch.zeros(4, 4).requires_grad_()
    kept: list[Any] = []  # outputs live on, as a model's do: no frees inside the marks

    def timed(module: Any) -> tuple[Any, Any]:
        x = leaf.mul(1.0)  # not a leaf, as a layer's input; a fresh one each call
        seen.clear()
        a = mark()
        kept.append(module(x))
        b = mark()
        return a, b

    sample = _Sample()
    pre, post = module_hooks(sample, mark, _guarded_alike, True, wait)
    handles = [
        probe.register_forward_pre_hook(pre("probe")),
        probe.register_forward_hook(post("probe")),
    ]
    plain: list[tuple[float, float, float]] = []
    parts: list[tuple[float, float, float, float, float]] = []
    try:
        for _ in range(calls):  # in turns: a drift of the machine's speed touches both alike
            a, b = timed(plain_probe)
            plain.append((seen[0] - a, b - seen[1], seen[1] - seen[0]))
            sample.calls.clear()
            a, b = timed(probe)
            _, c0, c1, _, _, _, p0, p1 = sample.calls[-1]
            parts.append((p0 - a, seen[0] - c0, c1 - seen[1], b - p1, seen[1] - seen[0]))
    finally:
        for h in handles:
            h.remove()
    kept.clear()
    before = statistics.median(p[0] for p in plain)
    after = statistics.median(p[1] for p in plain)
    body = statistics.median(p[2] for p in plain)
    out_pre, in_pre, in_post, out_post, hooked_body = (
        statistics.median(p[i] for p in parts) for i in range(5)
    )
    out_pre, out_post = out_pre - before, out_post - after
    # An op on a tensor that carries a gradient hook runs slower: the first op on the call's
    # input (inside the call) and on its output (in the parent, after it).
    slower = max(hooked_body - body, 0.0)
    return (max(out_pre, 0.0), max(in_pre, 0.0) + slower, max(in_post, 0.0),
            max(out_post, 0.0) + slower)


def _guarded_alike(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The sampler's ``guarded`` wrapper as it costs: one more frame and a try."""

    def run(*args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            raise

    return run


def _set_start(
    call: list[Any], mark: Callable[[], Any], wait: Callable[[], int | None], waits: list[Any]
) -> None:
    if call[3] is None:  # the first of its outputs' gradients to be ready
        call[3] = t = mark()
        w = wait()
        if w is not None:
            waits.append((t, w, mark(), False))


def _set_end(
    call: list[Any], mark: Callable[[], Any], wait: Callable[[], int | None], waits: list[Any]
) -> None:
    call[4] = t = mark()  # the last of its inputs' gradients to be ready
    w = wait()
    if w is not None:
        waits.append((t, w, mark(), False))


def _marks(sample: _Sample) -> Iterator[Any]:
    yield from sample.root
    for call in sample.calls:
        yield from call[1:5]
    for gap in sample.gaps:
        yield from gap


class _Forward(NamedTuple):
    """One sampled forward's marks, ms from the model's own start: kept to attribute it
    again once the run has measured what the hooks cost (``ModuleSampler.leak_scale``)."""

    root_ms: float
    calls: tuple[tuple[str, float, float], ...]
    #: the hooks' marked work and the thread's waits
    gaps: tuple[tuple[float, float], ...]
    #: per call: its interval, where its pre hook's work began and its post hook's ended
    hooks: tuple[tuple[float, float, float | None, float | None], ...]

    def leak_gaps(self, leak_ms: Sequence[float]) -> list[tuple[float, float]]:
        """The hooks' unmarked cost (``calibrate``'s four parts, ms) at its places: inside
        each call's interval and, outside it, in its parent's; the model's own hooks inside
        its forward."""
        out_pre, in_pre, in_post, out_post = leak_ms
        root = self.root_ms
        gaps = [(0.0, in_pre), (root - in_post, root)]
        for s, e, p0, p1 in self.hooks:
            gaps += [(s, s + in_pre), (e - in_post, e)]
            if p0 is not None:
                gaps.append((p0 - out_pre, p0))
            if p1 is not None:
                gaps.append((p1, p1 + out_post))
        return gaps

    def root_less(self, leak_ms: Sequence[float]) -> float:
        """The model's time less every gap and the hooks' cost ``leak_ms`` (``attribute``'s
        first figure, without the modules')."""
        root = max(self.root_ms, 0.0)
        holes = merged_gaps(root, (*self.gaps, *self.leak_gaps(leak_ms)))
        return root - sum(e - s for s, e in holes)

    def attribute(
        self, ancestors: Mapping[str, tuple[str, ...]], leak_ms: Sequence[float]
    ) -> tuple[float, dict[str, float]]:
        gaps = [*self.gaps, *self.leak_gaps(leak_ms)] if any(leak_ms) else list(self.gaps)
        return attribute(self.root_ms, self.calls, ancestors, gaps)


#: One kept sample: (the model's ms, ms waited or None, {module: ms}, a forward's marks or
#: None).
_Record = tuple[float, float | None, dict[str, float], _Forward | None]


def _reservoir(kept: list[Any], record: Any, seen: int, rng: random.Random) -> None:
    """Keep ``record``, the ``seen``-th: all of the first ``MAX_SHARES``, then each one
    equally likely to stay."""
    if len(kept) < MAX_SHARES:
        kept.append(record)
        return
    j = rng.randrange(seen)
    if j < MAX_SHARES:
        kept[j] = record


def _attributed_again(
    record: _Record, ancestors: Mapping[str, tuple[str, ...]], leak_ms: Sequence[float]
) -> _Record:
    """A kept forward sample attributed with the hooks' cost ``leak_ms`` (as it was, without
    its marks)."""
    _, waited, _, raw = record
    if raw is None:
        return record
    root, per_module = raw.attribute(ancestors, leak_ms)
    return root, waited, per_module, raw


def _clean(samples: Sequence[Any]) -> list[Any]:
    """The samples (``(ms, waited ms or None, ...)``) whose thread waited for a CPU at most
    ``PREEMPTED_FRACTION`` of their time."""
    return [s for s in samples if s[1] is not None and s[1] <= PREEMPTED_FRACTION * s[0]]

