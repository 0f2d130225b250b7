"""Compute efficiency: FLOPs of one training step, counted once by torch's FlopCounterMode.

The count runs on the run's first ``trace_step`` -- a warmup step, left out of every statistic,
since counting dispatches every op through Python and makes that step slow. It covers all the
step does under ``trace_step`` (forward, backward, the optimizer's arithmetic). Runs without
warmup steps, zero-change runs (no ``trace_step``) and runs whose traced model is compiled or
wrapped by ``torch.compile`` (counting under compilation could fail the user's step or leave
frames uncompiled) get no figure -- never an error, never a slower model. Left: a separately
compiled *function* first called inside the first traced step (docs/pinpoint.md). The rates and
MFU are computed with the summary (summary/build.py, summary/peaks.py).

``dtype`` is the dtype the counted ops ran in, as the counter sees them -- after autocast has
cast their inputs -- weighted by their FLOPs: ``bfloat16`` for an fp32 model under
``torch.autocast(dtype=torch.bfloat16)``, so that MFU divides by that dtype's peak. The
parameters' dtype is the fallback when no counted op carried a floating-point tensor.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

_COUNTER_CLASS: Any = None

NOT_COUNTED_COMPILED = "torch.compile in use: counting could fail a compiled step"
NOT_COUNTED_NO_OPS = "no op with a FLOP formula ran (matmul, convolution, attention)"
NOT_COUNTED_NO_WARMUP = "no warmup step to count on (warmup_steps=0)"
NOT_COUNTED_NO_STEP = (
    "no step: the counted step is the first trace_step (or, with none, the second step)"
)


def compiled_frames() -> int:
    """Frames dynamo compiled in this process so far (0 when dynamo is not loaded)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return 0
    try:
        return int(dynamo.utils.counters["frames"]["total"])
    except Exception:
        return 0


def compile_in_use(models: tuple[Any, ...] = (), frames_before: int = 0) -> bool:
    """Whether torch.compile is at work: a traced model (or a submodule) is compiled, or
    dynamo compiled frames since ``frames_before`` (``compiled_frames()`` when this run began:
    an earlier run in the same process, e.g. another test, does not count). Dynamo itself is
    imported by every torch.optim optimizer, so its presence says nothing."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return False
    if compiled_frames() > frames_before:
        return True
    optimized = getattr(getattr(dynamo, "eval_frame", None), "OptimizedModule", ())
    for model in models:
        try:
            for module in model.modules():
                if (optimized and isinstance(module, optimized)) or getattr(
                    module, "_compiled_call_impl", None
                ) is not None:
                    return True
        except Exception:
            return True  # cannot tell: do not count
    return False


def compile_wrapper(model: Any) -> Any:
    """The module ``torch.compile(model)`` returned, when one wraps ``model`` (else None).

    A user may trace ``model`` and call the compiled wrapper: then the wrapper's first call
    may fall in a step that arms a dispatch mode (dynamo skips a frame it first meets under
    one for good -- that model would never compile, and ``fullgraph=True`` would raise in the
    user's step), and a shadow of ``model.forward`` would sit inside the compiled region (a
    graph break). Nothing on ``model`` says it was wrapped: the wrapper keeps it in its
    ``_modules`` under ``_orig_mod``, so the referrers tell -- three scans of the heap, once
    per traced model."""
    import gc

    try:
        for modules in gc.get_referrers(model):
            if not (isinstance(modules, dict) and modules.get("_orig_mod") is model):
                continue
            for attrs in gc.get_referrers(modules):
                if isinstance(attrs, dict) and attrs.get("_modules") is modules:
                    for owner in gc.get_referrers(attrs):
                        if getattr(owner, "__dict__", None) is attrs:
                            return owner
    except Exception:
        return None
    return None


def not_counted(count: FlopCount, explicit_steps: bool, warmup_steps: int) -> str | None:
    """Why a run has no FLOP count (None when it has one)."""
    if count.flops is not None:
        return None
    if count.reason is not None:
        return count.reason
    if not explicit_steps:
        return NOT_COUNTED_NO_STEP
    return NOT_COUNTED_NO_WARMUP if warmup_steps == 0 else "not counted"


class ModuleFlops(NamedTuple):
    """One module's FLOPs in the counted step: its class name and the FLOPs its own code ran."""

    type: str
    flops: int


class FlopCount:
    """Counts one step: ``begin()`` at its start, ``end()`` at its end (both never raise)."""

    def __init__(self, warn: Callable[[str], None], frames_before: int = 0) -> None:
        self._warn = warn
        self._frames_before = frames_before
        self._mode: Any = None
        self.flops: int | None = None
        self.dtype: str | None = None
        #: Each module's own FLOPs, forward and backward, recomputation left out; by its name
        #: in the traced model (``named_modules``: "block1.0", the model itself "").
        self.by_module: dict[str, ModuleFlops] | None = None
        #: FLOPs of forwards recomputed in backward (activation checkpointing), and by the
        #: outermost module recomputed.
        self.recomputed_flops = 0
        self.recomputed: dict[str, ModuleFlops] = {}
        self.done = False
        #: Why there is no count (None: counted, or never tried).
        self.reason: str | None = None

    def begin(self, models: tuple[Any, ...], entering: Any = None) -> bool:
        """Start counting; False when it cannot (nothing is then left open). ``entering``: a
        module whose forward pre-hooks are running (zero-change mode's step boundary): the
        counter's module tracker missed its start, so it is told, and names its submodules
        under it as it would have."""
        if self.done:
            return False
        self.done = True
        if compile_in_use(models, self._frames_before) or any(
            compile_wrapper(m) is not None for m in models
        ):  # see compile_in_use, compile_wrapper
            # torch.compile is in use: a dispatch mode during compilation makes a fullgraph
            # compile raise in the user's step, and can leave frames uncompiled. Not counted.
            self.reason = NOT_COUNTED_COMPILED
            return False
        try:
            self.dtype = _param_dtype(models)
            mode = _counter_class()(display=False)
            # Our attribution in place of torch's module tracker (see the docstring): the mode
            # enters and exits it as it did that one.
            attribution = mode.mod_tracker = ModuleAttribution(models, entering)
            try:
                mode.__enter__()
            except Exception:
                attribution.close()
                raise
            self._mode = mode
            return True
        except Exception as exc:
            self.reason = f"the FLOP counter failed ({type(exc).__name__})"
            self._warn(f"FLOPs not counted ({exc!r})")
            return False

    def end(self) -> None:
        mode, self._mode = self._mode, None
        if mode is None:
            return
        try:
            try:
                mode.__exit__(None, None, None)
            finally:
                mode.mod_tracker.close()  # the hooks go, whatever the mode's exit did
            total = int(mode.get_total_flops())
            self.flops = total if total > 0 else None
            attribution = mode.mod_tracker
            self.by_module = attribution.own
            self.recomputed = attribution.recomputed
            self.recomputed_flops = attribution.recomputed_flops
            ran_in = _main_dtype(getattr(mode, "traceml_flops_by_dtype", None))
            if ran_in is not None:
                self.dtype = ran_in
            if self.flops is None:
                self.reason = NOT_COUNTED_NO_OPS
        except Exception as exc:
            self.reason = f"the FLOP counter failed ({type(exc).__name__})"
            self._warn(f"FLOPs not counted ({exc!r})")

    @property
    def counting(self) -> bool:
        return self._mode is not None


def _counter_class() -> Any:
    """torch's FlopCounterMode, also adding up each counted op's FLOPs by the dtype of its
    first floating-point input: the dtype it ran in, after autocast (which casts above the
    dispatch mode the counter is). Built once, on first use (torch is imported then)."""
    global _COUNTER_CLASS
    if _COUNTER_CLASS is not None:
        return _COUNTER_CLASS
    from torch.utils.flop_counter import FlopCounterMode

    class DtypeFlopCounter(FlopCounterMode):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.traceml_flops_by_dtype: dict[str, int] = {}

        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            formula = self.flop_registry.get(func_packet)
            if formula is None:
                return out
            try:
                n = int(formula(*args, **kwargs, out_val=out))
            except Exception:  # never into the user's step: the op goes uncounted
                return out
            self.flop_counts["Global"][func_packet] += n
            try:
                dtype = _first_float_dtype(args)
                if dtype is not None:
                    by = self.traceml_flops_by_dtype
                    by[dtype] = by.get(dtype, 0) + n
                self.mod_tracker.add(n)
            except Exception:  # never into the user's step: the dtype falls back
                pass
            return out

    _COUNTER_CLASS = DtypeFlopCounter
    return _COUNTER_CLASS


#: The key of our tag in an autograd node's ``metadata`` (a dict on the C++ node: it dies with
#: the node, and holds no reference to it from here).
_NODE_TAG = "traceml_ci.module"
#: Each attribution's own token, so a node tagged by an earlier count is not read as this one's.
_TOKENS = itertools.count(1)
#: The node a reentrant ``torch.utils.checkpoint`` leaves in the graph: its backward runs the
#: forward again (grad mode on), then backward through that.
_REENTRANT_CHECKPOINT = "CheckpointFunctionBackward"
#: AccumulateGrad's sequence number (a leaf's gradient sink: made whenever, runs no FLOPs).
_NO_SEQUENCE = 2**64 - 1


class ModuleAttribution:
    """Which module's own code ran each counted op (see the module docstring), in place of
    FlopCounterMode's module tracker: entered and exited by the mode, ``add(n)`` per counted
    op. Global forward pre/post hooks, for the counted step only, keep a stack of the modules
    whose forward runs (per thread); a module's forward exit tags the autograd nodes its forward
    made. Never raises into the user's step: a hook that fails leaves that module unattributed.
    """

    #: The mode's own total reads this (it used to be the tracker's set of entered modules).
    parents = frozenset({"Global"})

    def __init__(self, models: tuple[Any, ...], entering: Any = None) -> None:
        self._token = next(_TOKENS)
        #: id(module) -> index in ``_modules``, ``_names``, ``_own`` (its own FLOPs).
        self._index: dict[int, int] = {}
        self._modules: list[Any] = []
        self._names: list[str] = []
        self._own: list[int] = []
        for i, model in enumerate(models):
            prefix = "" if i == 0 else type(model).__name__  # a second model: its class first
            for name, module in model.named_modules():
                self._know(module, f"{prefix}.{name}" if prefix and name else name or prefix)
        #: thread -> the forwards running there: (index, first sequence number, in backward).
        self._stacks: dict[int, list[tuple[int, int, bool]]] = {}
        self._entering = entering
        self._handles: list[Any] = []
        #: Recomputation, episode by episode (one checkpointed call each): the outermost
        #: modules whose forward ran again, the FLOPs, the module a reentrant checkpoint's
        #: node came from (its forward's own ops run again outside any module).
        self._episodes: list[list[Any]] = []
        self._episode: list[Any] | None = None
        self.own: dict[str, ModuleFlops] = {}
        self.recomputed: dict[str, ModuleFlops] = {}
        self.recomputed_flops = 0

    # -- the mode enters and exits this as it did its module tracker -------------------------
    def __enter__(self) -> ModuleAttribution:
        import torch
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        self._torch = torch
        self._handles = [
            register_module_forward_pre_hook(self._pre),
            register_module_forward_hook(self._post, always_call=True),
        ]
        if self._entering is not None:  # its pre-hooks run now: ours would have run before
            self._pre(self._entering, ())
        return self

    def close(self) -> None:
        """Take the hooks off (again: a no-op)."""
        from traceml_ci.tracer.handles import remove_all

        handles, self._handles = self._handles, []
        remove_all(handles)

    def __exit__(self, *exc: Any) -> None:
        self.close()
        own: dict[str, ModuleFlops] = {}
        for i, module in enumerate(self._modules):
            if self._own[i]:
                name = self._names[i]
                had = own.get(name)  # two modules of one name (untraced ones, by class)
                figure = self._own[i] + (had.flops if had else 0)
                own[name] = ModuleFlops(type(module).__name__, figure)
        self.own, self.recomputed = own, self._regions()
        self._modules, self._index, self._stacks, self._episodes = [], {}, {}, []

    # -- per counted op ----------------------------------------------------------------------
    def add(self, n: int) -> None:
        """``n`` FLOPs of the op running now, to the module whose own code runs it."""
        torch = self._torch
        stack = self._stacks.get(threading.get_ident())
        if torch._C._current_graph_task_id() == -1:  # forward
            self._episode = None
            if stack:
                self._own[stack[-1][0]] += n
            return
        if stack and stack[-1][2]:  # a module's forward running in backward: recomputation
            self._recompute(n, None)
            return
        node = torch._C._current_autograd_node()
        tag = node.metadata.get(_NODE_TAG) if node is not None else None
        mine = tag[1] if tag is not None and tag[0] == self._token else None
        if (
            mine is not None
            and type(node).__name__ == _REENTRANT_CHECKPOINT
            and torch.is_grad_enabled()
        ):  # reentrant checkpointing's forward, run again outside any module
            self._recompute(n, mine)
            return
        self._episode = None
        if mine is not None:
            self._own[mine] += n

    def _recompute(self, n: int, region: int | None) -> None:
        """``n`` FLOPs recomputed, in the episode going on (opened here if none is)."""
        self.recomputed_flops += n
        if self._episode is None:
            self._episode = [[], 0, None]
            self._episodes.append(self._episode)
        self._episode[1] += n
        if region is not None and not self._episode[0]:
            self._episode[2] = region

    def _regions(self) -> dict[str, ModuleFlops]:
        """Each episode of recomputation by the module it recomputed: the one module whose
        forward ran (``checkpoint(block, x)``), else the module all that ran sit in (HF
        checkpoints a layer's ``forward``: its attention and MLP ran, the layer is named)."""
        by_name = {name: self._modules[i] for i, name in reversed(list(enumerate(self._names)))}
        out: dict[str, ModuleFlops] = {}
        for outermost, flops, region in self._episodes:
            if outermost:
                paths = [self._names[i].split(".") if self._names[i] else [] for i in outermost]
                common: list[str] = []
                for parts in zip(*paths, strict=False):  # the shortest path bounds it
                    if len(set(parts)) > 1:
                        break
                    common.append(parts[0])
                name = ".".join(common)
                if len(set(outermost)) == 1:
                    name = self._names[outermost[0]]
            elif region is not None:
                name = self._names[region]
            else:
                continue
            module = by_name.get(name)
            kind = type(module).__name__ if module is not None else ""
            had = out.get(name)
            out[name] = ModuleFlops(kind, flops + (had.flops if had else 0))
        return out

    # -- the hooks ---------------------------------------------------------------------------
    def _know(self, module: Any, name: str) -> int:
        i = self._index.get(id(module))
        if i is None:
            i = self._index[id(module)] = len(self._modules)
            self._modules.append(module)  # kept for the step: its id stays its own
            self._names.append(name)
            self._own.append(0)
        return i

    def _pre(self, module: Any, args: Any) -> None:
        try:
            stack = self._stacks.setdefault(threading.get_ident(), [])
            i = self._index.get(id(module))
            if i is None:  # outside the traced models: named under the module that called it
                i = self._know(module, self._child_name(module, stack))
            torch = self._torch
            again = torch._C._current_graph_task_id() != -1  # a forward in backward: recomputed
            if again and not any(frame[2] for frame in stack):  # the outermost one recomputed
                if self._episode is None:
                    self._episode = [[], 0, None]
                    self._episodes.append(self._episode)
                self._episode[0].append(i)
            stack.append((i, torch._C._autograd._get_sequence_nr(), again))
        except Exception:  # never into the user's step: this module goes unattributed
            pass

    def _child_name(self, module: Any, stack: list[tuple[int, int, bool]]) -> str:
        if stack:
            parent = stack[-1][0]
            for child_name, child in self._modules[parent]._modules.items():
                if child is module:
                    above = self._names[parent]
                    return f"{above}.{child_name}" if above else child_name
        return type(module).__name__

    def _post(self, module: Any, args: Any, output: Any) -> None:
        try:
            stack = self._stacks.get(threading.get_ident())
            i = self._index.get(id(module))
            if not stack or i is None:
                return
            for depth in range(len(stack) - 1, -1, -1):
                if stack[depth][0] == i:
                    start = stack[depth][1]
                    del stack[depth:]
                    break
            else:
                return
            self._tag(i, start, output)
        except Exception:  # never into the user's step
            pass

    def _tag(self, i: int, start: int, output: Any) -> None:
        """Tag the nodes made since sequence number ``start`` (by this forward) that lead to
        ``output``, and not already tagged by a module it called."""
        torch = self._torch
        todo = [t.grad_fn for t in _tensors(output, torch.Tensor) if t.grad_fn is not None]
        seen: dict[int, Any] = {}  # the nodes kept while walking: an id stays one node's
        mine = (self._token, i)
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen[id(node)] = node
            seq = node._sequence_nr()
            if seq < start or seq == _NO_SEQUENCE:
                continue
            meta = node.metadata
            tag = meta.get(_NODE_TAG)
            if tag is None or tag[0] != self._token:
                meta[_NODE_TAG] = mine
            todo.extend(next_node for next_node, _ in node.next_functions)


def _tensors(value: Any, tensor_type: type, depth: int = 0) -> list[Any]:
    """The tensors in a forward's output: itself, or inside lists, tuples, dicts (HF's
    ModelOutput) and dataclasses, a few levels down."""
    if isinstance(value, tensor_type):
        return [value]
    if depth > 4:
        return []
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    elif hasattr(value, "__dataclass_fields__"):
        items = [getattr(value, f, None) for f in value.__dataclass_fields__]
    else:
        return []
    return [t for item in items for t in _tensors(item, tensor_type, depth + 1)]


def _first_float_dtype(args: Any) -> str | None:
    """The dtype of the first floating-point tensor among an op's arguments (one level of
    lists/tuples, as convolution's)."""
    import torch

    for a in args:
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                return str(t.dtype).removeprefix("torch.")
    return None


def _main_dtype(by_dtype: dict[str, int] | None) -> str | None:
    """The dtype that carried the most FLOPs (None: none counted)."""
    if not by_dtype:
        return None
    dtype, n = max(by_dtype.items(), key=lambda kv: kv[1])
    return dtype if n > 0 else None


def _param_dtype(models: tuple[Any, ...]) -> str | None:
    for model in models:
        try:
            for p in model.parameters():
                return str(p.dtype).removeprefix("torch.")
        except Exception:
            continue
    return None
