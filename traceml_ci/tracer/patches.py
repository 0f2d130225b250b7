"""Auto mode: the few places in torch where phases begin and end, patched reversibly.

- dataloader: ``_BaseDataLoaderIter.__next__`` (every DataLoader iterator, any worker count)
- backward: ``torch.autograd.backward`` (what ``Tensor.backward`` calls)
- optimizer: torch's global optimizer step pre/post hooks (every optimizer)
- GradScaler.step: a step boundary even when it skips ``optimizer.step()``
- forward: the traced model's ``forward`` for the duration of one step (see ``wrap_forward``)

Every wrapper keeps the user's call and exceptions untouched; a failure of our own code goes to
``fail`` (warn once, stop tracing), never to the training loop.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from traceml_ci.tracer.recorder import BWD, DL, FWD, MAX_OUTSIDE_FETCHES, OPT, Recorder


def infer_batch_size(batch: Any, depth: int = 0) -> int | None:
    """Leading dimension of the first tensor in a batch (tensor, dict, list or tuple)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if depth > 3:
        return None
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = infer_batch_size(item, depth + 1)
            if size is not None:
                return size
    return None


def timed_call(
    orig: Callable[..., Any],
    p: int,
    rec: Recorder,
    fail: Callable[[BaseException], None],
    before: Callable[[tuple], None] | None = None,
) -> Callable[..., Any]:
    """``orig`` timed as phase ``p``.

    The common case -- host clock, tracing settled, no phase open -- is inlined here: one
    Python frame per phase and an integer addition, which is most of what tracing costs a small
    step. Everything else (device clocks, zero-change mode, the first step, nested phases) goes
    through the recorder's general methods. ``before`` runs on the general path only, i.e.
    until the tracer knows its device.
    """

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
        if not rec.fast or rec.active != -1:
            return general(args, kwargs)
        try:
            t0 = rec.mark()
            rec.active = p
            rec.t_open = t0
        except Exception as exc:
            fail(exc)
            return orig(*args, **kwargs)
        try:
            return orig(*args, **kwargs)
        finally:
            try:
                if rec.active == p and not rec.depth:  # else the state was reset under us
                    t1 = rec.mark()
                    rec.active = -1
                    if rec.in_step:
                        rec.acc[p] += t1 - t0  # host nanoseconds: the fast path's clock
                    else:
                        rec.record(p, t0, t1)
            except Exception as exc:
                fail(exc)

    return wrapper


class AutoPatches:
    def __init__(
        self,
        rec: Recorder,
        fail: Callable[[BaseException], None],
        on_first_batch: Callable[[Any], None],
        on_optimizer: Callable[[Any], None],
    ) -> None:
        self.rec = rec
        self.fail = fail
        self.on_first_batch = on_first_batch
        self.on_optimizer = on_optimizer
        #: True until the tracer knows its device: optimizer steps then report themselves.
        self.want_optimizer = True
        self._undo: list[Callable[[], None]] = []
        self._instantiated: set[type] = set()

    @property
    def installed(self) -> bool:
        return bool(self._undo)

    def install(self) -> None:
        if self._undo:
            return
        import torch

        self._patch_dataloader(torch)
        self._patch_backward(torch)
        self._hook_optimizers(torch)
        self._patch_grad_scaler(torch)

    def uninstall(self) -> None:
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:  # pragma: no cover - restoring must not raise either
                pass

    # -- the patches ---------------------------------------------------------------------
    def _patch_dataloader(self, torch: Any) -> None:
        from torch.utils.data import dataloader

        cls = dataloader._BaseDataLoaderIter
        orig = cls.__next__
        rec, fail = self.rec, self.fail
        state = {"first": True}
        on_first_batch = self.on_first_batch

        owner = threading.get_ident()
        get_ident = threading.get_ident

        def general(it: Any) -> Any:
            if get_ident() != owner:  # a prefetch thread: not the training loop
                return orig(it)
            try:
                rec.phase_begin(DL)
            except Exception as exc:
                fail(exc)
            try:
                batch = orig(it)
            except BaseException:  # StopIteration included: the loop ended
                rec.phase_abort(DL)
                raise
            try:
                rec.phase_end(DL)
                if state["first"]:
                    state["first"] = False
                    on_first_batch(batch)
            except Exception as exc:
                fail(exc)
            return batch

        def __next__(it: Any) -> Any:
            # Inline fast path, as in timed_call; the first batch goes the general way.
            if not rec.fast or rec.active != -1 or state["first"] or get_ident() != owner:
                return general(it)
            try:
                t0 = rec.mark()
                rec.active = DL
                rec.t_open = t0
            except Exception as exc:
                fail(exc)
                return orig(it)
            try:
                batch = orig(it)
            except BaseException:
                rec.phase_abort(DL)
                raise
            try:
                if rec.active == DL and not rec.depth:
                    t1 = rec.mark()
                    rec.active = -1
                    if rec.in_step:
                        rec.acc[DL] += t1 - t0
                    else:  # the usual place, before its step: Recorder.record, inline
                        outside = rec.outside
                        outside.append((DL, t0, t1))
                        if len(outside) > MAX_OUTSIDE_FETCHES:
                            del outside[0]
            except Exception as exc:
                fail(exc)
            return batch

        __next__.__wrapped__ = orig  # type: ignore[attr-defined]
        cls.__next__ = __next__
        self._undo.append(lambda: setattr(cls, "__next__", orig))

    def _patch_backward(self, torch: Any) -> None:
        autograd = torch.autograd
        orig = autograd.backward
        rec, fail = self.rec, self.fail

        backward = timed_call(orig, BWD, rec, fail)
        backward.__wrapped__ = orig  # type: ignore[attr-defined]
        backward.__doc__ = orig.__doc__
        autograd.backward = backward
        self._undo.append(lambda: setattr(autograd, "backward", orig))

    def _hook_optimizers(self, torch: Any) -> None:
        """Time the whole ``optimizer.step()`` call of every optimizer class.

        torch's global step hooks fire inside its step wrapper, after a ``record_function``
        (~20 us on a slow CPU) that they would leave to ``other``. So each optimizer class's
        ``step`` is wrapped: classes that exist now, and any class later, when torch first hooks
        it (``Optimizer._patch_step_function``, which every optimizer's ``__init__`` calls).
        """
        from torch.optim import optimizer as optim_mod

        base = optim_mod.Optimizer
        orig_patch = base._patch_step_function
        wrap = self._wrap_optimizer_class
        instantiated = self._instantiated

        def _patch_step_function(opt: Any) -> None:
            orig_patch(opt)
            try:
                instantiated.add(type(opt))
                wrap(optim_mod, type(opt))
            except Exception as exc:
                self.fail(exc)

        base._patch_step_function = _patch_step_function
        self._undo.append(lambda: setattr(base, "_patch_step_function", orig_patch))

        classes = []
        pending = list(base.__subclasses__())
        while pending:
            cls = pending.pop()
            pending.extend(cls.__subclasses__())
            classes.append(cls)
        # torch hooks a class's step at its first instance: a hooked class may have instances
        # from before us, and callers holding its old step (see _fallback_hooks). Instances
        # made while we were installed hold our wrapper, which still works after a reinstall.
        if any(
            getattr(cls.__dict__.get("step"), "hooked", False) and cls not in instantiated
            for cls in classes
        ):
            self._fallback_hooks(optim_mod)
        for cls in classes:
            # Only classes torch has hooked: the others are wrapped at their first
            # Optimizer.__init__ (above). A subclass whose __init__ never runs it (accelerate's
            # AcceleratedOptimizer) lacks the hook dicts torch's wrapper reads, and stays as is.
            if getattr(cls.__dict__.get("step"), "hooked", False):
                wrap(optim_mod, cls)

    def _fallback_hooks(self, optim_mod: Any) -> None:
        """A caller holding a class's step from before we wrapped it (an LR scheduler created
        before init() keeps the function it found, as does ``step = opt.step``) bypasses our
        wrapper; torch's global hooks still see that step. Nested in our wrapper they only count
        depth: the step is timed once. Only registered when optimizers may predate the tracer:
        they cost two more calls per step."""
        rec, fail, patches = self.rec, self.fail, self

        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            if rec.active == OPT:  # inside our class wrapper (the usual case): already timed
                rec.depth += 1
                return
            try:
                if patches.want_optimizer:
                    patches.on_optimizer(opt)
                rec.phase_begin(OPT)
            except Exception as exc:
                fail(exc)

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            if rec.active == OPT and rec.depth:
                rec.depth -= 1
                return
            try:
                rec.phase_end(OPT)
            except Exception as exc:
                fail(exc)

        self._undo.append(optim_mod.register_optimizer_step_pre_hook(pre).remove)
        self._undo.append(optim_mod.register_optimizer_step_post_hook(post).remove)

    def _wrap_optimizer_class(self, optim_mod: Any, cls: type) -> None:
        orig = cls.__dict__.get("step")
        if orig is None or not callable(orig) or getattr(orig, "_traceml_ci", False):
            return
        # Keep torch's own wrapper (record_function + global hooks) inside ours; a class never
        # instantiated yet gets it now, as its first __init__ would have done.
        hooked = orig
        if not getattr(orig, "hooked", False):
            hooked = optim_mod.Optimizer.profile_hook_step(orig)
            hooked.hooked = True  # type: ignore[attr-defined]
        patches = self

        def before(args: tuple) -> None:
            if patches.want_optimizer:  # zero-change mode: the first step names the device
                patches.on_optimizer(args[0])

        step = timed_call(hooked, OPT, self.rec, self.fail, before)
        functools.update_wrapper(step, hooked)
        step.hooked = True  # type: ignore[attr-defined]
        step._traceml_ci = True  # type: ignore[attr-defined]
        cls.step = step  # type: ignore[attr-defined]

        def undo() -> None:
            # A class first hooked by us and never instantiated meanwhile gets its plain step
            # back, so it does not look as if it had instances to a later tracer.
            keep_hooked = hooked is orig or cls in self._instantiated
            cls.step = hooked if keep_hooked else orig  # type: ignore[attr-defined]

        self._undo.append(undo)

    def _patch_grad_scaler(self, torch: Any) -> None:
        amp = getattr(torch, "amp", None)
        cls = getattr(amp, "GradScaler", None)
        if cls is None:  # pragma: no cover - very old torch
            return
        orig = cls.step
        rec, fail = self.rec, self.fail

        def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            result = orig(self, optimizer, *args, **kwargs)
            try:
                rec.optimizer_boundary()
            except Exception as exc:
                fail(exc)
            return result

        step.__wrapped__ = orig  # type: ignore[attr-defined]
        cls.step = step
        self._undo.append(lambda: setattr(cls, "step", orig))


def wrap_forward(
    model: Any, rec: Recorder, fail: Callable[[BaseException], None]
) -> tuple[dict, str, bool, Any]:
    """Time ``model``'s outermost forward until ``unwrap_forward``: an instance attribute that
    shadows ``forward`` (or a compiled module's ``_compiled_call_impl``).

    Cheaper than module hooks (which force nn.Module's slow call path) and outside any
    torch.compile'd region, so it causes no graph break. It lives for one step only, so a
    ``copy.deepcopy(model)`` or ``torch.save(model)`` outside the step never sees it.
    """
    d = model.__dict__
    key = "_compiled_call_impl" if d.get("_compiled_call_impl") is not None else "forward"
    had = key in d
    orig = d[key] if had else getattr(model, key)

    timed = timed_call(orig, FWD, rec, fail)
    d[key] = timed
    return d, key, had, orig


class ForwardTimer:
    """``wrap_forward`` for one model, step after step, without building a wrapper each step:
    while the model has no instance ``forward`` and is not compiled in place, the same timed
    bound method is set and removed (two dict operations)."""

    __slots__ = ("model", "d", "func", "timed", "undo", "rec", "fail")

    def __init__(self, model: Any, rec: Recorder, fail: Callable[[BaseException], None]) -> None:
        self.model = model
        self.d = model.__dict__
        self.rec = rec
        self.fail = fail
        self.func = getattr(type(model), "forward", None)
        bind = getattr(self.func, "__get__", None)
        self.timed = timed_call(bind(model, type(model)), FWD, rec, fail) if bind else None
        self.undo = (self.d, "forward", False, None)

    def wrap(self) -> tuple[dict, str, bool, Any]:
        d = self.d
        if (
            self.timed is not None
            and "forward" not in d
            and d.get("_compiled_call_impl") is None
            and type(self.model).forward is self.func
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


class RootForwardHooks:
    """Zero-change mode: no model was named, so find the outermost modules of the first step with
    global module hooks, then time only those roots with ordinary forward hooks."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.roots: dict[int, Any] = {}
        self.timed: list[Any] = []
        self._depth = 0
        self._handles: list[Any] = []
        self._global: list[Any] = []

    def install_discovery(self) -> None:
        from torch.nn.modules import module as module_mod

        def pre(mod: Any, args: Any) -> None:
            if self._depth == 0:
                self.roots.setdefault(id(mod), mod)
                self.rec.phase_begin(FWD)
            self._depth += 1

        def post(mod: Any, args: Any, out: Any) -> None:
            self._depth -= 1
            if self._depth == 0:
                self.rec.phase_end(FWD)

        self._global = [
            module_mod.register_module_forward_pre_hook(pre),
            module_mod.register_module_forward_hook(post, always_call=True),
        ]

    def settle(self) -> None:
        """Replace global discovery hooks with hooks on the roots found so far."""
        if not self._global:
            return
        for h in self._global:
            h.remove()
        self._global = []
        self._depth = 0
        rec = self.rec

        def pre(mod: Any, args: Any) -> None:
            rec.phase_begin(FWD)

        def post(mod: Any, args: Any, out: Any) -> None:
            rec.phase_end(FWD)

        # Loss functions are modules too; a model is a root with parameters.
        self.timed = [m for m in self.roots.values() if next(m.parameters(), None) is not None]
        for mod in self.timed:
            self._handles.append(mod.register_forward_pre_hook(pre))
            self._handles.append(mod.register_forward_hook(post, always_call=True))

    def uninstall(self) -> None:
        for h in self._global + self._handles:
            h.remove()
        self._global, self._handles = [], []
