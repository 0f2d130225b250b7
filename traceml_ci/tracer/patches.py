"""Auto mode: the few places in torch where phases begin and end, patched reversibly.

- dataloader: ``_BaseDataLoaderIter.__next__`` (every DataLoader iterator, any worker count)
- backward: ``torch.autograd.backward`` (what ``Tensor.backward`` calls)
- optimizer: torch's global optimizer step pre/post hooks (every optimizer)
- GradScaler.step: a step boundary even when it skips ``optimizer.step()``
- forward: the traced model's ``forward`` for the duration of one step (``recorder.ForwardTimer``)

The wrappers themselves are built by the recorder (``Recorder.timed``/``timed_next``), the one
owner of the per-step state; this module only decides where they go and takes them out again.
Every wrapper keeps the user's call and exceptions untouched; a failure of our own code goes to
``fail`` (warn once, stop tracing), never to the training loop.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from traceml_ci.tracer.handles import held_weakly
from traceml_ci.tracer.recorder import BWD, FWD, OPT, SAMPLES_ATTR, Recorder


def loader_settings(iterator: Any) -> dict[str, Any]:
    """A DataLoader iterator's own settings, as its loader gave them (read once per iterator).

    ``pin_memory`` is what the loader does: torch turns it off where no accelerator exists.
    ``prefetch_factor`` only applies with worker processes (None without)."""
    batch = None
    if getattr(iterator, "_auto_collation", False):  # else each item is a whole batch
        batch = getattr(getattr(iterator, "_index_sampler", None), "batch_size", None)
    workers = int(getattr(iterator, "_num_workers", 0) or 0)
    return {
        "num_workers": workers,
        "pin_memory": bool(getattr(iterator, "_pin_memory", False)),
        "persistent_workers": bool(getattr(iterator, "_persistent_workers", False)),
        "prefetch_factor": getattr(iterator, "_prefetch_factor", None) if workers else None,
        "batch_size": int(batch) if isinstance(batch, int) and batch > 0 else None,
        "collate_fn": _collate_name(getattr(iterator, "_collate_fn", None)),
    }


def _collate_name(fn: Any) -> str | None:
    """``"default"`` for torch's own collate (or convert), else ``module.qualname`` of the
    function a DataLoader was given (a partial's function; None: none to name)."""
    if fn is None:
        return None
    from torch.utils.data._utils.collate import default_collate, default_convert

    if fn is default_collate or fn is default_convert:
        return "default"
    fn = getattr(fn, "func", fn)  # functools.partial
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}.{name}"[:256]


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


class AutoPatches:
    """The auto-mode patches of one tracer, installed and removed as a whole."""

    def __init__(
        self,
        rec: Recorder,
        fail: Callable[[BaseException], None],
        on_first_batch: Callable[[Any, Any], int],
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
        __next__ = self.rec.timed_next(orig, self.fail, self.on_first_batch)
        __next__.__wrapped__ = orig  # type: ignore[attr-defined]
        # A new iterator's samples per batch: unknown until its first fetch. The default stays
        # after uninstall, so a wrapper someone still holds never meets a missing attribute.
        setattr(cls, SAMPLES_ATTR, None)
        cls.__next__ = __next__
        self._undo.append(lambda: setattr(cls, "__next__", orig))

    def _patch_backward(self, torch: Any) -> None:
        autograd = torch.autograd
        orig = autograd.backward
        rec, fail = self.rec, self.fail

        backward = rec.timed(orig, BWD, fail)
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
        wrapper; torch's global hooks still see that step. Inside our wrapper they are a re-entry
        of the optimizer phase: the step is timed once. Only registered when optimizers may
        predate the tracer: they cost two more calls per step."""
        rec, fail, patches = self.rec, self.fail, self
        #: Per open step call: whether its pre hook began the phase (False: our class wrapper
        #: already times it -- the usual case, kept to a read and an append, as it runs inside
        #: the optimizer phase).
        began: list[bool] = []

        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            if rec.active == OPT:
                began.append(False)
                return
            began.append(True)
            try:
                if patches.want_optimizer:
                    patches.on_optimizer(opt)
                rec.phase_begin(OPT)
            except Exception as exc:
                fail(exc)

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            if began and began.pop():
                try:
                    rec.phase_end(OPT)
                except Exception as exc:
                    fail(exc)

        self._undo.append(optim_mod.register_optimizer_step_pre_hook(pre).remove)
        self._undo.append(optim_mod.register_optimizer_step_post_hook(post).remove)

    def _wrap_optimizer_class(self, optim_mod: Any, cls: type) -> None:
        """Time ``cls.step`` once torch has hooked it (its first instance does): torch's own
        wrapper (record_function + global hooks) stays inside ours, as in an untraced run.

        A class torch never hooked is left alone: its step is only reached through a
        subclass's ``super().step()`` (already timed) or hooked at its own first instance.
        Adding torch's wrapper to it here would run record_function and every global
        optimizer hook twice per step, charging that work to the optimizer phase."""
        orig = cls.__dict__.get("step")
        if (
            orig is None
            or not callable(orig)
            or not getattr(orig, "hooked", False)
            or getattr(orig, "_traceml_ci", False)
        ):
            return
        patches = self

        def before(args: tuple) -> None:
            if patches.want_optimizer:  # zero-change mode: the first step names the device
                patches.on_optimizer(args[0])

        step = self.rec.timed(orig, OPT, self.fail, before)
        functools.update_wrapper(step, orig)
        step.hooked = True  # type: ignore[attr-defined]
        step._traceml_ci = True  # type: ignore[attr-defined]
        cls.step = step  # type: ignore[attr-defined]
        self._undo.append(lambda: setattr(cls, "step", orig))

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


class RootForwardHooks:
    """Zero-change mode: no model was named, so find the outermost modules of the first step with
    global module hooks, then time only those roots with ordinary forward hooks.

    Discovery settles at the first optimizer step -- or, when that step runs the forward itself
    (``optimizer.step(closure)``), as soon as a root with parameters has finished its forward.

    Evaluation between steps (nanoGPT's ``estimate_loss``: ``model.eval()`` and ``no_grad``)
    is no step's forward: a root that has trained (run a forward with grad) and now runs in
    eval mode without grad is evaluating; its time goes to ``note_eval`` (one span per run of
    evaluation forwards), outside the steps. A teacher that never trains (distillation) stays
    forward."""

    def __init__(self, rec: Recorder, note_eval: Callable[[int, int], None] | None = None) -> None:
        self.rec = rec
        self.note_eval = note_eval
        #: The outermost modules of the first step, by id, until discovery settles.
        self.roots: dict[int, Any] = {}
        #: The models timed since, held weakly: a model the user drops is freed as untraced.
        self._timed: list[Callable[[], Any]] = []
        #: The timed root whose forward pre-hook is running (None outside one).
        self.entering: Any = None
        self._depth = 0
        self._pending = False
        self._handles: list[Any] = []
        self._global: list[Any] = []
        self._flush_eval: Callable[[], Any] = _nothing

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
                if self._pending and _has_params(mod):
                    self.settle()

        self._global = [
            module_mod.register_module_forward_pre_hook(pre),
            module_mod.register_module_forward_hook(post, always_call=True),
        ]

    @property
    def timed(self) -> list[Any]:
        """The timed models still alive."""
        return [m for ref in self._timed if (m := ref()) is not None]

    def settle(self) -> None:
        """Replace global discovery hooks with hooks on the roots found so far (later, at the
        end of the first root forward with parameters, if none was found yet)."""
        if not self._global:
            return
        models = [m for m in self.roots.values() if _has_params(m)]
        if not models:  # a closure runs the forward inside the first optimizer step
            self._pending = True
            return
        for h in self._global:
            h.remove()
        self._global = []
        self._depth = 0
        self._pending = False
        rec = self.rec
        import torch

        grad_enabled = torch.is_grad_enabled
        now = time.perf_counter_ns
        trained: set[int] = set()
        #: [start, end] (perf_counter_ns) of the evaluation under way, and whether one of its
        #: forwards is open (roots never nest: they are the outermost modules).
        span: list[int] = []
        evaluating = [False]
        note_eval = self.note_eval

        def pre(mod: Any, args: Any) -> None:
            if grad_enabled():
                trained.add(id(mod))
                if span:
                    if note_eval is not None:
                        note_eval(span[0], span[1])
                    span.clear()
            elif not mod.training and id(mod) in trained:
                began = rec.evaluation_begins()
                t = now()
                if not span:
                    span.extend((began if isinstance(began, int) else t, t))
                evaluating[0] = True
                return
            self.entering = mod  # a step boundary here begins inside this root's forward
            rec.phase_begin(FWD)
            self.entering = None

        def post(mod: Any, args: Any, out: Any) -> None:
            if evaluating[0]:
                evaluating[0] = False
                if span:
                    span[1] = now()
                return
            rec.phase_end(FWD)

        self._flush_eval = lambda: (note_eval(span[0], span[1]) if span and note_eval else None)
        # Loss functions are modules too; a model is a root with parameters.
        self._timed = [held_weakly(m) for m in models]
        self.roots = {}  # discovery is over: hold no module it saw
        for mod in models:
            self._handles.append(mod.register_forward_pre_hook(pre))
            self._handles.append(mod.register_forward_hook(post, always_call=True))

    def uninstall(self) -> None:
        self._flush_eval()  # an evaluation that ran last
        self._flush_eval = _nothing
        for h in self._global + self._handles:
            h.remove()
        self._global, self._handles = [], []


def _nothing() -> None:
    return None


def _has_params(module: Any) -> bool:
    return next(module.parameters(), None) is not None
