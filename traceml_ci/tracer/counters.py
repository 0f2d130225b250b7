"""Deterministic counters of one sampled step: scalar reads, ATen ops by kind, settings,
optimizer state, leaked bytes.

The probe runs on one warmup step (``SAMPLED_STEP``, the one after the FLOP count's), never on
an analysed one and never per step: a ``TorchDispatchMode`` sees every op of that step, and a
few ``torch.Tensor`` methods are wrapped for that step alone (restored at its end).

* **Scalar reads** (host↔device syncs on an accelerator; on a CPU run, the reads that *would*
  sync there): ``.item()``, ``bool()``/``float()``/``int()`` of a tensor, ``.tolist()``,
  ``.numpy()``, ``.cpu()``, ``nonzero`` and boolean-mask indexing, a copy from a device to the
  host. Each is attributed to the nearest frame of the user's code (``file:line`` relative to
  the run's root; past torch, traceml-ci, installed libraries and the standard library:
  tracer/sites.py). A read of a *host* tensor made by torch's own Python code (Adam's step
  counter) is no sync anywhere and is not counted; one made by the user's code or a library's
  is.
* **Optimizer**: the classes that stepped in the sampled step, their parameter groups, state
  tensors per parameter (0-dim ones, such as Adam's step counter, left out) and their bytes;
  and the traced models' parameters.
* **Leak**: storages first allocated by an op of the sampled step that are still alive
  ``LEAK_AFTER_STEPS`` steps later (weak references: nothing is kept alive by looking), with the
  op and the user's line that allocated the largest (tracer/sites.py, as for the reads).

* **Autograd history kept**: each autograd graph node the sampled step made (the outputs of its
  torch calls, seen by a ``TorchFunctionMode``) carries a marker in its ``metadata`` dict, which
  lives exactly as long as the node; markers alive ``LEAK_AFTER_STEPS`` steps later are the
  nodes something still holds -- a running ``total = total + loss``, a kept output, a
  validation loss made with grad on. The newest of them is the line that holds the history.
* **Eval forwards with grad**: a traced model's forward in eval mode with autograd on (a
  validation forward without ``torch.no_grad()``), by line.
* **Collectives**: the ``c10d`` ops the step ran (DDP's gradient all-reduces among them), with
  their bytes: a missing ``no_sync()`` under gradient accumulation is one more per micro-batch.
* **Python calls**: on the two steps after the sampled one (the fewer kept), the Python
  functions called, the user's and the libraries' apart (tracer/pycalls.py).
* **Host-to-device copies**: copies from a host tensor to a device (``_to_copy`` and ``copy_``
  as the dispatcher sees them, ``non_blocking`` or not), their bytes and how many came from
  unpinned memory (Tuning Guide: pin memory, ``non_blocking=True``). A CPU run has none to
  make: its block says ``device: cpu``.
* **Ops**: every ATen op the step ran, by kind, each kind with the user's line that ran the
  most of it (``+62 zero_ per step at train.py:20``): a ``zero_grad(set_to_none=False)``, a
  ``foreach=False``, a copy of the state dict per step change what a step does, exactly.
* **Settings** that change what a step costs, read once on that step (the PyTorch Performance
  Tuning Guide's list that a CPU run can see): anomaly detection, deterministic algorithms, the
  autograd profiler, cuDNN benchmark and matmul precision, the dtype the step's matrix products
  ran in (a lost autocast), the stepped optimizers' ``foreach``/``fused``/``capturable``, and a
  traced ``DistributedDataParallel``'s ``find_unused_parameters``, ``static_graph``,
  ``gradient_as_bucket_view`` and bucket size.

FLOPs per module come from the FLOP count (tracer/flops.py) and are added here. All of it is
plain data in the summary's ``counters`` shape (docs/summary.md).
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from traceml_ci.tracer import compiled
from traceml_ci.tracer.holders import find_holder
from traceml_ci.tracer.pycalls import PythonCalls
from traceml_ci.tracer.sites import Sites

#: The key of the marker in a graph node's ``metadata`` dict.
GRAPH_MARK = "traceml_ci.step"

#: The sampled step: the second ``trace_step`` (the first is the FLOP count's, and builds the
#: optimizer's state). Needs at least this many + 1 warmup steps.
SAMPLED_STEP = 1
#: A storage allocated in the sampled step and alive this many steps after it has leaked.
LEAK_AFTER_STEPS = 3
#: Sites / modules listed (the largest first); with the ops by kind the block stays near 2 KB.
TOP_SITES = 5
#: Lines listed in the blocks added for issue 32 (graph, eval_grad, h2d, collectives): the
#: first names the cause, and the summary stays under 8 KB.
TOP_LINES = 3
TOP_MODULES = 5
#: Op kinds listed with their counts (the most run first; the rest summed in ``other``): a
#: step runs 20-80 kinds, ~22 bytes each in the summary, which stays under 8 KB. A kind a
#: side does not list ran at most as often as its least run listed one: the gate names a
#: move as a range there (summary/view.py: ``op_kind_moves``).
TOP_OP_KINDS = 32
#: Device types that are the host (a copy between them is no host-to-device copy; ``meta``
#: holds no data).
HOST_DEVICES = ("cpu", "meta")
#: ATen ops whose output dtype says what the step's matrix products ran in.
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution",
                        "mkldnn_convolution", "_mkldnn_linear", "mkldnn_linear"})

#: Tensor methods that read a tensor's values into Python (and so sync on an accelerator).
_READ_METHODS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__")
_METHOD_OP = {"__bool__": "bool", "__float__": "float", "__int__": "int"}

def not_measured_warmup(sampled_step: int = SAMPLED_STEP) -> str:
    """Why nothing was sampled: the sampled step is an analysed one (too few warmup steps)."""
    return f"fewer than {sampled_step + 1} warmup steps"


NOT_MEASURED_WARMUP = not_measured_warmup()
NOT_MEASURED_COMPILED = "torch.compile in use"

#: torch files seen through when asking who made a call: Tensor's Python methods (the user's
#: ``f"{loss:.3f}"``) and the wrappers a dispatch mode is called through.
_TRANSPARENT = ("_tensor.py", "_compile.py", "eval_frame.py", "_python_dispatch.py", "_ops.py")


def _made_by_torch(frame: Any, finder: Sites) -> bool:
    """Whether the nearest frame outside traceml-ci (and torch's wrappers in ``_TRANSPARENT``)
    -- the one that made the call -- is torch's own Python."""
    while frame is not None:
        path = frame.f_code.co_filename
        if not finder.is_own(path):
            internal = finder.is_torch(path)
            if not (internal and path.endswith(_TRANSPARENT)):
                return internal
        frame = frame.f_back
    return True  # none but ours: not the user's read


class CounterProbe:
    """Arms on the sampled step (``begin``/``end``, never raising), checks the leak
    ``LEAK_AFTER_STEPS`` steps later (``after_step``); ``record()`` is the summary block."""

    def __init__(self, warn: Callable[[str], None], root: Any = None) -> None:
        self._warn = warn
        #: The run's root, that sites are shown relative to (None: found from the cwd).
        self._root = root
        self._sites: Sites | None = None
        #: The step sampled (0-based): trace_step's second; zero-change mode's third (its
        #: first boundary is the first step's end, where the FLOP count's step begins).
        self.sampled_step = SAMPLED_STEP
        self.done = False  # sampled (or given up): nothing more to arm
        self.reason: str | None = None
        self.active = False
        self.sample_ms: float | None = None
        self._mode: Any = None
        self._saved: list[tuple[str, Any]] = []
        self._hook: Any = None
        self._thread = 0
        self._depth = 0
        self._models: tuple[Any, ...] = ()
        self._optimizers: list[Any] = []
        #: (file:line, op) -> reads in the sampled step.
        self.reads: dict[tuple[str, str], int] = {}
        #: weakref(storage) -> (bytes, op, file:line), for storages the step allocated.
        self._new: list[tuple[Any, int, str, str]] = []
        self._check_at: int | None = None
        self.params: dict[str, int] | None = None
        self.optimizer: dict[str, Any] | None = None
        self.leak: dict[str, Any] | None = None
        self.flops: dict[str, Any] | None = None
        #: (op kind, file:line) -> times run in the sampled step.
        self.ops: dict[tuple[str, str], int] = {}
        #: dtype -> matrix products (MATMUL_OPS) that produced it in the sampled step.
        self.matmul_dtypes: dict[str, int] = {}
        self.settings: dict[str, Any] | None = None
        #: The line of the op the dispatch mode is counting (None: not found yet).
        self._here: str | None = None
        self._fmode: Any = None
        self._fhook: Any = None
        self._hooks: list[Any] = []
        #: The phase the step is in (forward, optimizer, other; backward is autograd's own:
        #: ``_in_backward() != -1``), for the ops and allocations by phase.
        self._phase = "other"
        self._in_backward: Callable[[], int] = lambda: -1
        #: phase -> ATen ops; phase -> [allocations, bytes] (new storages, training thread).
        self.phase_ops: dict[str, int] = {}
        #: Whether an optimizer stepped in the sampled step was stepped by a GradScaler.
        self._scaled = False
        self.allocs: dict[str, list[int]] = {}
        #: (weakref(marker), op, file:line, weakref(output)) of each graph node the sampled
        #: step made, in order.
        self._marks: list[tuple[Any, str, str, Any]] = []
        self.graph: dict[str, Any] | None = None
        #: file:line -> forwards of a traced model in eval mode with autograd on.
        self.eval_grad: dict[str, int] = {}
        #: (c10d op, file:line) -> [calls, bytes] in the sampled step.
        self.collectives: dict[tuple[str, str], list[int]] = {}
        #: file:line -> [copies, bytes, from unpinned memory]: host-to-device copies.
        self.h2d: dict[str, list[int]] = {}
        #: Python calls, counted on the step after the sampled one (tracer/pycalls.py).
        self.python = PythonCalls()
        #: torch.compile's counts as the run starts (tracer/compiled.py).
        self._compiled_at_start = _quietly(compiled.snapshot)

    @property
    def armed(self) -> bool:
        """Whether a count runs in the step now (the sampled step's, or the Python calls')."""
        return self.active or self.python.active

    @property
    def pending(self) -> bool:
        """Whether a step boundary still has work here (the sample, or the leak check)."""
        return not self.done or self.active or self._check_at is not None

    # -- the sampled step --------------------------------------------------------------------
    def begin(self, step: int, warmup: int, models: tuple[Any, ...]) -> bool:
        """At the start of step number ``step`` (0-based): arm if it is the sampled one, and a
        warmup step (``warmup`` of them)."""
        sampled = self.sampled_step
        if self.done:
            self._begin_python(step, warmup)
            return False
        if step < sampled:
            return False
        self.done = True
        if step != sampled or warmup <= sampled:
            self.reason = not_measured_warmup(sampled)
            return False
        from traceml_ci.tracer import flops

        if flops.compile_in_use(models) or any(  # a dispatch mode could fail a compiled step
            flops.compile_wrapper(m) is not None for m in models
        ):
            self.reason = NOT_MEASURED_COMPILED
            return False
        t0 = time.perf_counter()
        try:
            import torch
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            self._models = models
            self._thread = threading.get_ident()
            self._sites = Sites(self._root)  # the folders as they are now, read once
            self.settings = torch_settings(torch, models)
            self._patch(torch)
            self._hook = register_optimizer_step_post_hook(self._stepped)
            self._hooks = [register_optimizer_step_pre_hook(self._stepping),
                           torch.nn.modules.module.register_module_forward_hook(
                               self._forward_post)]
            self._in_backward = torch._C._current_graph_task_id
            self._mode = _mode_class()(self)
            self._mode.__enter__()
            self._fmode = _graph_mode_class()(self)
            self._fmode.__enter__()
            self._fhook = torch.nn.modules.module.register_module_forward_pre_hook(
                self._forward_pre)
            self.active = True
        except Exception as exc:
            self._restore()
            self.reason = f"the counters failed ({type(exc).__name__})"
            self._warn(f"counters not measured ({exc!r})")
            return False
        self.sample_ms = (time.perf_counter() - t0) * 1e3
        return True

    def _begin_python(self, step: int, warmup: int) -> None:
        """Count Python calls on the steps after the sampled one, warmup steps too."""
        py = self.python
        if (step != self.sampled_step + 1 + py.counted or py.counted >= py.STEPS
                or warmup <= step or self.reason is not None or py.active
                or py.reason is not None):
            return
        try:
            py.start()
        except Exception as exc:
            py.reason = f"the count failed ({type(exc).__name__})"
            self._warn(f"Python calls not counted ({exc!r})")

    def end(self, step: int) -> None:
        """At the end of the sampled step (``step`` steps done): disarm, read the optimizers;
        at the end of the next, stop counting Python calls."""
        if self.python.active:
            try:
                self.python.stop(self._sites)
            except Exception as exc:
                self.python.reason = f"the count failed ({type(exc).__name__})"
                self._warn(f"Python calls not counted ({exc!r})")
        if not self.active:
            return
        t0 = time.perf_counter()
        self._restore()
        try:
            self.params = _params(self._models, self._optimizers)
            self.optimizer = _optimizer(self._optimizers)
            self.settings = {**(self.settings or {}), **optimizer_settings(self._optimizers)}
            if self._optimizers:
                self.settings["grad_scaler"] = self._scaled
            if self.matmul_dtypes:
                self.settings["matmul_dtype"] = max(self.matmul_dtypes.items(),
                                                    key=lambda kv: (kv[1], kv[0]))[0]
            self._check_at = step + LEAK_AFTER_STEPS
        except Exception as exc:
            self._warn(f"counters incomplete ({exc!r})")
        self._optimizers = []
        self._models = ()
        self.sample_ms = (self.sample_ms or 0.0) + (time.perf_counter() - t0) * 1e3

    def after_step(self, steps_done: int) -> None:
        """After each step while pending: the leak check, once ``LEAK_AFTER_STEPS`` passed."""
        if self._check_at is None or steps_done < self._check_at:
            return
        self._check_at = None
        new, self._new = self._new, []
        marks, self._marks = self._marks, []
        try:  # what only a reference cycle keeps is garbage, gone when the collector says:
            # alive now, it is collected first (a clean step leaves nothing: no collection)
            if any(ref() is not None for ref, *_ in new) or any(
                    ref() is not None for ref, *_ in marks):
                gc.collect()
        except Exception:
            pass
        try:
            self.graph = graph_block(marks, LEAK_AFTER_STEPS)
            kept = [t for *_, ref in marks if (t := ref()) is not None]
            if kept and self._sites is not None:  # who holds them, and where it stores
                held = find_holder(kept, self._sites, sys._getframe(1))
                if held is not None:
                    self.graph["held_by"] = held
            del kept
        except Exception as exc:
            self._warn(f"graph check failed ({exc!r})")
        try:
            alive = [(b, op, at) for ref, b, op, at in new if ref() is not None]
            by_site: dict[tuple[str, str], int] = {}
            for b, op, at in alive:
                by_site[(op, at)] = by_site.get((op, at), 0) + b
            top = sorted(by_site.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_SITES]
            self.leak = {
                "after_steps": LEAK_AFTER_STEPS,
                "retained_bytes_per_step": sum(b for b, _, _ in alive),
                "top": [{"op": op, "at": at, "bytes": b} for (op, at), b in top],
            }
        except Exception as exc:
            self._warn(f"leak check failed ({exc!r})")

    def close(self) -> None:
        """The run ended (or the sampled step raised): disarm, drop the references."""
        self._restore()
        self.python.abort()
        self._new = []
        self._marks = []
        self._check_at = None
        self._optimizers = []

    # -- what the mode and the wrapped methods call ------------------------------------------
    def note_read(self, op: str, tensor: Any, frame: Any) -> None:
        finder = self._sites
        if threading.get_ident() != self._thread or finder is None:
            return
        on_device = getattr(getattr(tensor, "device", None), "type", "cpu") != "cpu"
        if on_device or not _made_by_torch(frame, finder):
            key = (finder.site(frame), op)
            self.reads[key] = self.reads.get(key, 0) + 1

    def phase(self) -> str:
        return "backward" if self._in_backward() != -1 else self._phase

    def site(self, frame: Any) -> str:
        """The user's line of the op being dispatched, found once per op (``_here``, reset by
        the mode for each): its storages, its kind, its copy or collective share it."""
        here = self._here
        if here is None:
            finder = self._sites
            here = self._here = finder.site(frame) if finder is not None else "?"
        return here

    def note_op(self, op: str, frame: Any) -> None:
        if self._sites is None:
            return
        phase = self.phase()
        self.phase_ops[phase] = self.phase_ops.get(phase, 0) + 1
        key = (op, self.site(frame))
        self.ops[key] = self.ops.get(key, 0) + 1

    def ours(self) -> bool:
        """Whether the calling thread runs the step: the training thread, or an autograd
        engine's thread running a backward (CUDA's run on a thread per device)."""
        return threading.get_ident() == self._thread or self._in_backward() != -1

    def note_new(self, storage: Any, nbytes: int, op: str, frame: Any) -> None:
        if self.ours():
            tally = self.allocs.setdefault(self.phase(), [0, 0])
            tally[0] += 1
            tally[1] += nbytes
        self._new.append((weakref.ref(storage), nbytes, op, self.site(frame)))

    def note_graph(self, out: Any, op: str, frame: Any) -> None:
        """Mark the graph nodes of a torch call's outputs (the training thread's)."""
        if threading.get_ident() != self._thread:
            return
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for t in outs:
            fn = getattr(t, "grad_fn", None)
            if fn is None:
                continue
            meta = fn.metadata
            if GRAPH_MARK in meta:  # an op returning its input (an in-place one): marked
                continue
            mark = _Mark()
            meta[GRAPH_MARK] = mark
            finder = self._sites
            self._marks.append((weakref.ref(mark), op,
                                finder.site(frame) if finder is not None else "?",
                                weakref.ref(t)))

    def note_h2d(self, nbytes: int, pinned: bool, frame: Any) -> None:
        entry = self.h2d.setdefault(self.site(frame), [0, 0, 0])
        entry[0] += 1
        entry[1] += nbytes
        entry[2] += 0 if pinned else 1

    def note_collective(self, op: str, nbytes: int, frame: Any) -> None:
        key = (op, self.site(frame))
        entry = self.collectives.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += nbytes

    def _forward_pre(self, module: Any, args: Any) -> None:
        """A traced model's forward begins; in eval mode with autograd on, it is a validation
        forward without ``torch.no_grad()`` (submodules in eval mode, a frozen norm, are not
        news)."""
        try:
            if threading.get_ident() != self._thread or not any(
                    module is m for m in self._models):
                return
            self._phase = "forward"
            if not module.training:
                import torch

                if torch.is_grad_enabled():
                    finder = self._sites
                    at = finder.site(sys._getframe(1)) if finder is not None else "?"
                    self.eval_grad[at] = self.eval_grad.get(at, 0) + 1
        except Exception:  # never into the user's step
            pass

    def _forward_post(self, module: Any, args: Any, out: Any) -> None:
        if any(module is m for m in self._models) and threading.get_ident() == self._thread:
            self._phase = "other"

    def _stepping(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if threading.get_ident() == self._thread:
            self._phase = "optimizer"
            try:  # stepped by a GradScaler (amp/grad_scaler.py's step calls it)?
                self._scaled = self._scaled or _called_from(sys._getframe(1), _SCALER_FILE)
            except Exception:
                pass

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if threading.get_ident() == self._thread:
            self._phase = "other"
        if not any(o is optimizer for o in self._optimizers):
            self._optimizers.append(optimizer)

    def _patch(self, torch: Any) -> None:
        cls = torch.Tensor
        for name in _READ_METHODS:
            original = getattr(cls, name)
            self._saved.append((name, cls.__dict__.get(name)))
            setattr(cls, name, _reader(self, _METHOD_OP.get(name, name), original))

    def _restore(self) -> None:
        self.active = False
        for hook in (self._fhook, *self._hooks):
            if hook is not None:
                hook.remove()
        self._fhook, self._hooks = None, []
        fmode, self._fmode = self._fmode, None
        if fmode is not None:  # entered last: left first
            try:
                _leave(fmode, function=True)
            except Exception as exc:
                self._warn(f"counters: {exc!r}")
        mode, self._mode = self._mode, None
        if mode is not None:
            try:
                _leave(mode, function=False)
            except Exception as exc:
                self._warn(f"counters: {exc!r}")
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()
        if self._saved:
            import torch

            for name, original in reversed(self._saved):
                if original is None:
                    delattr(torch.Tensor, name)
                else:
                    setattr(torch.Tensor, name, original)
            self._saved = []

    # -- the summary block -------------------------------------------------------------------
    def record(self) -> dict[str, Any] | None:
        """The ``counters`` block (None: nothing measured). Under torch.compile, where the
        step is not sampled, its ``compile`` block alone."""
        compile_counts = _quietly(lambda: compiled.compile_block(self._compiled_at_start))
        if not self.done or self.reason is not None or self.params is None:
            if compile_counts is not None and self.reason == NOT_MEASURED_COMPILED:
                return {"sampled_step": self.sampled_step, "compile": compile_counts}
            return None
        sites = sorted(self.reads.items(), key=lambda kv: (-kv[1], kv[0]))
        out: dict[str, Any] = {
            "sampled_step": self.sampled_step,
            "syncs": {
                "per_step": sum(self.reads.values()),
                "sites": [{"at": at, "op": op, "count": n} for (at, op), n in sites[:TOP_SITES]],
            },
            "params": self.params,
        }
        found = {"optimizer": self.optimizer, "leak": self.leak, "flops": self.flops,
                 "ops": ops_block(self.ops, self.phase_ops) if self.ops else None,
                 "allocs": allocs_block(self.allocs),
                 "settings": self.settings or None, "graph": self.graph,
                 "eval_grad": eval_grad_block(self.eval_grad),
                 "collectives": collectives_block(self.collectives),
                 "python": self.python.block,
                 "h2d": h2d_block(self.h2d, (self.settings or {}).get("device")),
                 "compile": compile_counts}
        out.update((key, value) for key, value in found.items() if value is not None)
        return out


#: The file whose ``step`` steps an optimizer for a GradScaler.
_SCALER_FILE = ("amp", "grad_scaler.py")
#: Frames looked at above an optimizer's step for a GradScaler's.
_SCALER_DEPTH = 8


def _called_from(frame: Any, tail: tuple[str, ...]) -> bool:
    """Whether a frame within ``_SCALER_DEPTH`` of ``frame`` runs code from a file whose path
    ends with ``tail``."""
    suffix = "/".join(tail)
    for _ in range(_SCALER_DEPTH):
        if frame is None:
            return False
        if frame.f_code.co_filename.replace("\\", "/").endswith(suffix):
            return True
        frame = frame.f_back
    return False


def _leave(mode: Any, *, function: bool) -> None:
    """Take ``mode`` off its stack. On top (as it should be): its own ``__exit__``. Under a
    mode the user entered in the step and still has on: popped from under it, the user's
    modes put back as they were (``__exit__`` would pop the user's instead)."""
    import torch

    if function:
        stack, pop, push = (torch.overrides._get_current_function_mode_stack(),
                            torch._C._pop_torch_function_stack,
                            torch._C._push_on_torch_function_stack)
    else:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        stack, pop, push = (_get_current_dispatch_mode_stack(),
                            lambda: torch._C._pop_torch_dispatch_stack(None),
                            torch._C._push_on_torch_dispatch_stack)
    if not any(m is mode for m in stack):
        return
    if stack[-1] is mode:
        mode.__exit__(None, None, None)
        return
    above = []
    while True:
        top = pop()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        push(m)


def _quietly(read: Callable[[], Any]) -> Any:
    """``read()``, or None if it raised (an optional count never costs the rest)."""
    try:
        return read()
    except Exception:
        return None


class _Mark:
    """Lives in one graph node's ``metadata`` (so exactly as long as the node)."""

    __slots__ = ("__weakref__",)


def graph_block(marks: list[tuple[Any, str, str, Any]], after_steps: int) -> dict[str, Any]:
    """The ``counters.graph`` block: the sampled step's graph nodes still alive
    ``after_steps`` steps later, the lines that made the most of them, and the newest one's
    (what holds the history: a running total's add, a kept output's op)."""
    alive = [(op, at) for ref, op, at, _ in marks if ref() is not None]
    by_site: dict[str, int] = {}
    for _, at in alive:
        by_site[at] = by_site.get(at, 0) + 1
    top = sorted(by_site.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_LINES]
    out: dict[str, Any] = {"after_steps": after_steps, "nodes_kept_per_step": len(alive)}
    if top:
        out["top"] = [{"at": at, "nodes": n} for at, n in top]
    if alive:
        op, at = alive[-1]
        out["newest"] = {"op": op, "at": at}
    return out


def eval_grad_block(by_site: dict[str, int]) -> dict[str, Any]:
    """The ``counters.eval_grad`` block: a traced model's eval-mode forwards with autograd on,
    per step, by line."""
    top = sorted(by_site.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_LINES]
    return _with_sites({"per_step": sum(by_site.values())},
                       [{"at": at, "count": n} for at, n in top])


def h2d_block(by_site: dict[str, list[int]], device: Any) -> dict[str, Any]:
    """The ``counters.h2d`` block: host-to-device copies per step, their bytes, those from
    unpinned memory, by line; ``device``: the run's (``cpu``: nothing to copy to)."""
    top = sorted(by_site.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_LINES]
    if not by_site:  # none made (a CPU run always): the device alone says why
        return {"device": str(device or "cpu"), "per_step": 0}
    return _with_sites({"device": str(device or "cpu"),
                        "per_step": sum(v[0] for v in by_site.values()),
                        "bytes_per_step": sum(v[1] for v in by_site.values()),
                        "unpinned_per_step": sum(v[2] for v in by_site.values())},
                       [{"at": at, "count": n, "bytes": b} for at, (n, b, _) in top])


def collectives_block(found: dict[tuple[str, str], list[int]]) -> dict[str, Any]:
    """The ``counters.collectives`` block: c10d ops per step, their bytes, the lines."""
    top = sorted(found.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_LINES]
    return _with_sites({"per_step": sum(n for n, _ in found.values()),
                        "bytes_per_step": sum(b for _, b in found.values())},
                       [{"op": op, "at": at, "count": n, "bytes": b}
                        for (op, at), (n, b) in top])


def _with_sites(block: dict[str, Any], sites: list[dict[str, Any]]) -> dict[str, Any]:
    """``block`` with its ``sites`` where there are any (the summary stays small)."""
    if sites:
        block["sites"] = sites
    return block


def _reader(probe: CounterProbe, op: str, original: Any) -> Any:
    """A Tensor method that counts itself, then does what it did (nested reads uncounted)."""

    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        if probe._depth == 0:
            try:
                probe.note_read(op, self, sys._getframe(1))
            except Exception:  # never into the user's step
                pass
        probe._depth += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            probe._depth -= 1

    read.__name__ = getattr(original, "__name__", op)
    read.__doc__ = getattr(original, "__doc__", None)
    return read


_MODE_CLASS: Any = None


def _mode_class() -> Any:
    """The dispatch mode (built on first use: torch is imported then)."""
    global _MODE_CLASS
    if _MODE_CLASS is not None:
        return _MODE_CLASS
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    aten = torch.ops.aten
    scalar_reads = {
        aten._local_scalar_dense.default: "item",
        aten.nonzero.default: "nonzero",
        aten.masked_select.default: "masked_select",
    }
    bool_dtypes = (torch.bool, torch.uint8)

    class CounterMode(TorchDispatchMode):  # type: ignore[misc]
        def __init__(self, probe: CounterProbe) -> None:
            super().__init__()
            self.probe = probe

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            self.probe._here = None  # this op's line: found at most once
            try:
                self._count(func, args, kwargs or {}, out)
            except Exception:  # never into the user's step
                pass
            try:  # on its own: a failure here loses no read and no new storage
                self._kind(func, args, kwargs or {}, out)
            except Exception:
                pass
            return out

        def _count(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
            probe = self.probe
            ins = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            if probe._depth == 0 and ins:
                op = scalar_reads.get(func)
                if (
                    op is None
                    and func is aten.index.Tensor
                    and any(
                        isinstance(i, torch.Tensor) and i.dtype in bool_dtypes
                        for i in tree_leaves(args[1:])
                    )
                ):
                    op = "mask index"
                if op is None and func is aten._to_copy.default and ins[0].device.type != "cpu":
                    dev = kwargs.get("device")
                    op = "to(cpu)" if dev is not None and torch.device(dev).type == "cpu" else None
                if op is not None:
                    probe.note_read(op, ins[0], sys._getframe())
            seen = {t.untyped_storage().data_ptr() for t in ins if t.layout == torch.strided}
            for t in tree_leaves(out):
                if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                    continue
                storage = t.untyped_storage()
                nbytes = storage.nbytes()
                if nbytes and storage.data_ptr() not in seen:
                    name = func.overloadpacket.__name__
                    probe.note_new(storage, nbytes, name, sys._getframe())

        def _h2d(self, name: str, args: Any, out: Any) -> None:
            """A copy from a host tensor to a device: ``_to_copy(src, device=...)`` or
            ``dst.copy_(src)``."""
            src, dst = (args[0], out) if name == "_to_copy" else (args[1], args[0])
            if not (isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)):
                return
            if src.device.type in HOST_DEVICES and dst.device.type not in HOST_DEVICES:
                pinned = src.device.type == "cpu" and src.is_pinned()
                self.probe.note_h2d(src.numel() * src.element_size(), pinned,
                                    sys._getframe())

        def _kind(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
            """The op by kind, a collective's bytes, a matrix product's dtype (the training
            thread's only)."""
            probe = self.probe
            if not probe.ours():
                return
            name = func.overloadpacket.__name__
            probe.note_op(name, sys._getframe())
            if name in ("_to_copy", "copy_"):
                self._h2d(name, args, out)
            if func.namespace == "c10d":
                nbytes = sum(t.untyped_storage().nbytes() for t in tree_leaves(args)
                             if isinstance(t, torch.Tensor) and t.layout == torch.strided)
                probe.note_collective(name, nbytes, sys._getframe())
            if name in MATMUL_OPS and isinstance(out, torch.Tensor):
                dtype = str(out.dtype).removeprefix("torch.")
                probe.matmul_dtypes[dtype] = probe.matmul_dtypes.get(dtype, 0) + 1

    _MODE_CLASS = CounterMode
    return _MODE_CLASS


_GRAPH_MODE_CLASS: Any = None


def _graph_mode_class() -> Any:
    """The torch-function mode that marks the graph nodes of the sampled step (built on first
    use). Above autograd, where an output has its ``grad_fn``; nested calls are not seen."""
    global _GRAPH_MODE_CLASS
    if _GRAPH_MODE_CLASS is not None:
        return _GRAPH_MODE_CLASS
    from torch.overrides import TorchFunctionMode

    class GraphMode(TorchFunctionMode):  # type: ignore[misc]
        def __init__(self, probe: CounterProbe) -> None:
            super().__init__()
            self.probe = probe

        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            try:
                self.probe.note_graph(out, getattr(func, "__name__", "?"), sys._getframe(1))
            except Exception:  # never into the user's step
                pass
            return out

    _GRAPH_MODE_CLASS = GraphMode
    return _GRAPH_MODE_CLASS


def _params(models: tuple[Any, ...], optimizers: list[Any]) -> dict[str, int]:
    """The traced models' parameters (else the optimizers'): tensors, elements, bytes."""
    seen: dict[int, Any] = {}
    for model in models:
        for p in model.parameters():
            seen.setdefault(id(p), p)
    if not seen:
        for opt in optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    seen.setdefault(id(p), p)
    ps = list(seen.values())
    return {
        "tensors": len(ps),
        "elements": sum(p.numel() for p in ps),
        "bytes": sum(p.numel() * p.element_size() for p in ps),
    }


def _optimizer(optimizers: list[Any]) -> dict[str, Any] | None:
    """The optimizers that stepped: classes, groups, and their state after that step."""
    if not optimizers:
        return None
    import torch

    params = state_tensors = state_bytes = groups = 0
    for opt in optimizers:
        groups += len(opt.param_groups)
        for group in opt.param_groups:
            params += len(group["params"])
        for st in opt.state.values():
            for v in st.values() if isinstance(st, dict) else ():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    state_tensors += 1
                    state_bytes += v.numel() * v.element_size()
    return {
        "classes": sorted({type(o).__name__ for o in optimizers}),
        "param_groups": groups,
        "params": params,
        "state_tensors_per_param": round(state_tensors / params, 4) if params else 0.0,
        "state_bytes": state_bytes,
    }


def allocs_block(by_phase: dict[str, list[int]]) -> dict[str, Any]:
    """The ``counters.allocs`` block: storages the step's ops allocated (new, not views or
    in-place results) and their bytes, in all and by phase ``[count, bytes]``."""
    return {"per_step": sum(n for n, _ in by_phase.values()),
            "bytes_per_step": sum(b for _, b in by_phase.values()),
            "by_phase": {p: list(v) for p, v in sorted(by_phase.items())}}


def ops_block(ops: dict[tuple[str, str], int],
              by_phase: dict[str, int] | None = None) -> dict[str, Any]:
    """The ``counters.ops`` block: ops per step, per kind (the ``TOP_OP_KINDS`` run most)
    as ``kinds_block`` lists them, and per phase."""
    out = kinds_block(ops, TOP_OP_KINDS, "per_step")
    if by_phase:
        out["by_phase"] = dict(sorted(by_phase.items()))
    return out


def kinds_block(ops: dict[tuple[str, str], int], top: int, total: str) -> dict[str, Any]:
    """``{total: n, "kinds": {"zero_": [62, 0]}, "sites": ["train.py:20"], "other": n}``:
    ops in all, and per kind (the ``top`` run most) its count and, as an index into
    ``sites``, the line that ran the most of it; ``other``: the ops of the kinds not listed.
    The step's ops (``ops_block``) and the input pipeline's per batch (tracer/inputs.py)."""
    kinds: dict[str, int] = {}
    where: dict[str, tuple[int, str]] = {}
    for (op, at), n in ops.items():
        kinds[op] = kinds.get(op, 0) + n
        if (n, at) > where.get(op, (0, "")):
            where[op] = (n, at)
    listed = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    sites: list[str] = []
    index: dict[str, int] = {}
    out: dict[str, list[int]] = {}
    for op, n in listed:
        at = where[op][1]
        if at not in index:
            index[at] = len(sites)
            sites.append(at)
        out[op] = [n, index[at]]
    count = sum(kinds.values())
    return {total: count, "kinds": out, "sites": sites,
            "other": count - sum(n for _, n in listed)}


def torch_settings(torch: Any, models: tuple[Any, ...]) -> dict[str, Any]:
    """What the code told torch that changes a step's cost, read as the sampled step starts.
    Each read on its own: one this torch lacks leaves that setting out, never the counters."""
    reads: dict[str, Callable[[], Any]] = {
        "anomaly_detection": lambda: bool(torch.is_anomaly_enabled()),
        "deterministic_algorithms": lambda: bool(torch.are_deterministic_algorithms_enabled()),
        "autograd_profiler": lambda: bool(torch.autograd._profiler_enabled()),
        "cudnn_benchmark": lambda: bool(torch.backends.cudnn.benchmark),
        "matmul_precision": lambda: str(torch.get_float32_matmul_precision())[:64],
        "device": lambda: _device_of(models),
    }
    out: dict[str, Any] = {}
    for key, read in reads.items():
        try:
            out[key] = read()
        except Exception:  # an API this torch has not: that setting is not recorded
            pass
    for model in models:
        if type(model).__name__ == "DistributedDataParallel":  # no import of torch.distributed
            out.update({
                "ddp_find_unused_parameters": bool(getattr(model, "find_unused_parameters",
                                                           False)),
                "ddp_static_graph": bool(getattr(model, "static_graph", False)),
                "ddp_gradient_as_bucket_view": bool(getattr(model, "gradient_as_bucket_view",
                                                            False)),
                "ddp_bucket_cap_mb": _bucket_mb(getattr(model, "bucket_bytes_cap", None)),
            })
            break
    return out


def _device_of(models: tuple[Any, ...]) -> str:
    for model in models:
        for p in model.parameters():
            return str(p.device.type)
    return "cpu"


def _bucket_mb(nbytes: Any) -> float | None:
    return round(nbytes / (1024 * 1024), 3) if isinstance(nbytes, int) else None


def optimizer_settings(optimizers: list[Any]) -> dict[str, Any]:
    """The stepped optimizers' implementation flags (``foreach``, ``fused``, ``capturable``):
    as their first parameter group has them, ``"default"`` where left to torch (None)."""
    out: dict[str, Any] = {}
    for flag in ("foreach", "fused", "capturable"):
        values = []
        for opt in optimizers:
            for group in opt.param_groups:
                if flag in group:
                    values.append(group[flag])
        if values:
            first = values[0]
            out[f"optimizer_{flag}"] = "default" if first is None else bool(first)
    return out


def flops_block(count: Any) -> dict[str, Any] | None:
    """The FLOP count's figures (``tracer/flops.FlopCount``) as the ``counters.flops`` block:
    per step and the modules whose own code ran the most, ``{"module": "block1.0", "type":
    "Conv2d", "flops": n}`` (names as ``named_modules`` gives them; forward and backward,
    recomputation left out); with activation checkpointing, ``recomputed``: the FLOPs of the
    forwards run again in backward and the modules recomputed (the checkpointed blocks)."""
    per_step, by_module = count.flops, count.by_module
    if not per_step or by_module is None:
        return None
    out: dict[str, Any] = {"per_step": int(per_step), "top_modules": _top_modules(by_module)}
    if count.recomputed_flops:
        out["recomputed"] = {
            "per_step": int(count.recomputed_flops),
            "top_modules": _top_modules(count.recomputed),
        }
    return out


def _top_modules(by_module: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``TOP_MODULES`` modules with the most FLOPs (name, then class, breaks a tie)."""
    top = sorted(by_module.items(), key=lambda kv: (-kv[1].flops, kv[0]))[:TOP_MODULES]
    return [{"module": name, "type": m.type, "flops": int(m.flops)} for name, m in top if m.flops]
