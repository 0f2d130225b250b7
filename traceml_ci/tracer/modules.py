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
of the modules and of the model's own time alike: a sampled step is slower than the others
by that work, and shares are of the step as it runs unsampled.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from traceml_ci.summary.keys import DEFAULT_MODULE_SAMPLE_S, TOP_MODULES
from traceml_ci.summary.stats import iqr
from traceml_ci.tracer.clocks import HostClock
from traceml_ci.tracer.flops import compile_in_use, compiled_frames

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
    holes: list[list[float]] = []  # the gaps, clipped, merged where they touch
    for s, e in sorted((max(s, 0.0), min(e, root_ms)) for s, e in gaps):
        if e <= s:
            continue
        if holes and s <= holes[-1][1]:
            holes[-1][1] = max(holes[-1][1], e)
        else:
            holes.append([s, e])
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
    """One sampled step's marks. A call is ``[name, fwd0, fwd1, bwd0, bwd1, ends_with_pass]``;
    ``gaps``: the forward hooks' own work, ``[from, to]`` marks (host clock only)."""

    __slots__ = ("calls", "root", "backward_done", "gaps")

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []
        self.root: list[Any] = [None, None, None, None]  # forward from/to, backward from/to
        self.backward_done = False
        self.gaps: list[list[Any]] = []


class ModuleSampler:
    """Arms hooks for one step now and then; keeps each module's sampled times and shares."""

    def __init__(self, warn: Callable[[str], None], every_s: float = SAMPLE_EVERY_S) -> None:
        self._warn = warn
        #: Frames dynamo had compiled when this run began (see ``compile_in_use``).
        self.frames_before = compiled_frames()
        self.every_ns = int(every_s * 1e9)
        self.enabled = every_s > 0
        self.clock: Any = HostClock()
        self.model: Any = None
        self.modules: list[tuple[str, Any]] = []
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
        self._rng = random.Random(0)
        self._current: _Sample | None = None
        self._pending: list[_Sample] = []
        # per direction: summed ms of the model and of each module, steps, per-sample shares
        self.steps = {"forward": 0, "backward": 0}
        self.root_ms = {"forward": 0.0, "backward": 0.0}
        self.totals: dict[str, dict[str, float]] = {"forward": {}, "backward": {}}
        self.shares: dict[str, dict[str, list[float]]] = {"forward": {}, "backward": {}}

    def set_every(self, every_s: float) -> None:
        """A later ``init(module_sample_s=...)``, before the first step: 0 turns sampling off."""
        self.every_ns = int(every_s * 1e9)
        self.enabled = every_s > 0 and self.off_reason is None

    def tick_ns(self, housekeeping_ns: int) -> int:
        """How often the step store should call ``tick``: its housekeeping interval, or the
        sample period if shorter (a smoke test of a few hundred ms still gets samples)."""
        if not self.enabled or self.every_ns <= 0:
            return housekeeping_ns
        return max(min(housekeeping_ns, self.every_ns), MIN_TICK_NS)

    @property
    def sampled(self) -> int:
        return self.steps["forward"]

    def watch(self, model: Any) -> None:
        """The model whose submodules are sampled (the first traced one)."""
        if self.model is not None or model is None or not self.enabled:
            return
        self.model = model
        if compile_in_use((model,), self.frames_before):
            self._off(OFF_COMPILED)
            return
        self.modules = select_modules(model)
        self.types = {name: type(module).__name__[:MAX_NAME] for name, module in self.modules}
        names = [name for name, _ in self.modules]
        self.ancestors = {n: tuple(a for a in names if n.startswith(a + ".")) for n in names}

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
            self._missed_root()
        if not self.enabled or self.handles or not self.modules or now_ns < self.next_ns:
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
        try:
            self._arm()
        except Exception as exc:
            self._disarm()
            self.enabled = False
            self._warn(f"module sampling stopped ({exc!r})")

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
        calls = sample.calls
        # The hooks' own work, left out of every time: host marks cost ~50 ns; device events
        # would time the device, which the hooks do not occupy.
        gaps = sample.gaps if self.clock.kind == "host" else None
        warn = self._warn
        failed: list[bool] = []

        def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any) -> None:
                try:
                    fn(*args)
                except Exception as exc:  # never into the user's step
                    if not failed:
                        failed.append(True)
                        warn(f"module sampling stopped ({exc!r})")
                    self.enabled = False

            return run

        opened: dict[str, list[list[Any]]] = {}  # a module's calls not returned yet

        def pre(name: str) -> Callable[..., None]:
            def hook(module: Any, args: Any) -> None:
                g0 = mark() if gaps is not None else None
                call = [name, None, None, None, None, True]
                calls.append(call)
                for t in _tensors(args):
                    call[5] = False
                    t.register_hook(guarded(lambda grad, c=call: _set_end(c, mark())))
                opened.setdefault(name, []).append(call)
                call[1] = mark()  # the call starts as its hook's work ends
                if gaps is not None:
                    gaps.append([g0, call[1]])

            return guarded(hook)

        def post(name: str) -> Callable[..., None]:
            def hook(module: Any, args: Any, output: Any) -> None:
                end = mark()  # the call ends as its hook's work begins
                open_calls = opened.get(name)
                if not open_calls:
                    return
                call = open_calls.pop()
                call[2] = end
                for t in _tensors(output):
                    t.register_hook(guarded(lambda grad, c=call: _set_start(c, mark)))
                if gaps is not None:
                    gaps.append([end, mark()])

            return guarded(hook)

        for name, module in self.modules:
            self.handles.append(module.register_forward_pre_hook(pre(name)))
            self.handles.append(module.register_forward_hook(post(name)))

        def root_pre(module: Any, args: Any) -> None:
            sample.root[0] = mark()

        def backward_end() -> None:
            if self._current is not sample:  # a backward that came steps later: not counted
                return
            sample.root[3] = mark()
            sample.backward_done = True
            self._pending.append(sample)
            self._current = None

        def backward_start(grad: Any) -> None:
            if sample.root[2] is None:
                sample.root[2] = mark()
                import torch

                torch.autograd.Variable._execution_engine.queue_callback(guarded(backward_end))

        def root_post(module: Any, args: Any, output: Any) -> None:
            self._disarm()  # one step's forward: the hooks go as it returns
            if sample.root[0] is None:
                return
            self.missed = 0
            sample.root[1] = mark()
            hooked = False
            for t in _tensors(output):
                t.register_hook(guarded(backward_start))
                hooked = True
            if not hooked:  # no backward through this output (eval, or no grad)
                self._pending.append(sample)
                self._current = None

        self.handles.append(self.model.register_forward_pre_hook(guarded(root_pre)))
        # Last among the model's post hooks: it removes them all.
        self.handles.append(self.model.register_forward_hook(guarded(root_post)))

    def _disarm(self) -> None:
        handles, self.handles = self.handles, []
        for h in handles:
            try:
                h.remove()
            except Exception:
                pass

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
        to one chain of modules (``attribute``), the hooks' own work left out."""
        el = self.clock.elapsed_ms
        f0, f1, b0, b1 = sample.root
        if f0 is None or f1 is None:
            return
        backward = sample.backward_done and b0 is not None and b1 is not None
        fwd: list[tuple[str, float, float]] = []
        bwd: list[tuple[str, float, float]] = []
        for name, c0, c1, d0, d1, ends_with_pass in sample.calls:
            if c0 is not None and c1 is not None:
                fwd.append((name, el(f0, c0), el(f0, c1)))
            end = b1 if ends_with_pass or d1 is None else d1
            if backward and d0 is not None and end is not None:
                bwd.append((name, el(b0, d0), el(b0, end)))
        gaps = [
            (el(f0, g0), el(f0, g1)) for g0, g1 in sample.gaps if g0 is not None and g1 is not None
        ]
        self._add_direction("forward", *attribute(el(f0, f1), fwd, self.ancestors, gaps))
        if backward:
            self._add_direction("backward", *attribute(el(b0, b1), bwd, self.ancestors))

    def _add_direction(self, direction: str, root_ms: float, per_module: dict[str, float]) -> None:
        """Add one sample: ``root_ms`` the model's own time, ``per_module`` the modules'
        (``attribute``: each at most its parent's, siblings at most their parent's)."""
        if root_ms <= 0:
            return
        self.steps[direction] += 1
        self.root_ms[direction] += root_ms
        totals, shares = self.totals[direction], self.shares[direction]
        for name, ms in per_module.items():
            totals[name] = totals.get(name, 0.0) + ms
            kept = shares.setdefault(name, [])
            share = 100.0 * ms / root_ms
            if len(kept) < MAX_SHARES:
                kept.append(share)
            else:  # a reservoir: every sample equally likely to be kept
                j = self._rng.randrange(self.steps[direction])
                if j < MAX_SHARES:
                    kept[j] = share

    def summary(self) -> dict[str, Any] | None:
        """The ``modules`` block (docs/pinpoint.md); None when sampling never ran."""
        if self.off_reason is not None:
            return {"sampled_steps": 0, "off": self.off_reason, "forward": []}
        n = self.steps["forward"]
        if not n or self.root_ms["forward"] <= 0:
            return None
        out: dict[str, Any] = {
            "sampled_steps": n,
            "every_s": self.every_ns / 1e9,
            "clock": self.clock.kind,
            "forward_ms": round(self.root_ms["forward"] / n, 4),
            "forward": self._top("forward"),
        }
        nb = self.steps["backward"]
        if nb and self.root_ms["backward"] > 0:
            out["backward_steps"] = nb
            out["backward_ms"] = round(self.root_ms["backward"] / nb, 4)
            out["backward"] = self._top("backward")
        return out

    def _top(self, direction: str) -> list[dict[str, Any]]:
        n, root = self.steps[direction], self.root_ms[direction]
        top = sorted(self.totals[direction].items(), key=lambda kv: -kv[1])[:TOP_MODULES]
        rows = []
        for name, ms in top:
            shares = self.shares[direction].get(name) or []
            rows.append(
                {
                    "name": name,
                    "type": self.types.get(name, ""),
                    "ms": round(ms / n, 4),
                    "share_pct": round(100.0 * ms / root, 2),
                    # per-sample spread of the share: the gate's noise rule for modules
                    "noise_pp": round(iqr(shares), 2) if len(shares) >= 4 else None,
                }
            )
        return rows


def _set_start(call: list[Any], mark: Callable[[], Any]) -> None:
    if call[3] is None:  # the first of its outputs' gradients to be ready
        call[3] = mark()


def _set_end(call: list[Any], t: Any) -> None:
    call[4] = t  # the last of its inputs' gradients to be ready


def _marks(sample: _Sample) -> Iterator[Any]:
    yield from sample.root
    for call in sample.calls:
        yield from call[1:5]
    for gap in sample.gaps:
        yield from gap
