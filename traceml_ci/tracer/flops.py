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

import sys
from collections.abc import Callable
from typing import Any

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


class FlopCount:
    """Counts one step: ``begin()`` at its start, ``end()`` at its end (both never raise)."""

    def __init__(self, warn: Callable[[str], None], frames_before: int = 0) -> None:
        self._warn = warn
        self._frames_before = frames_before
        self._mode: Any = None
        self.flops: int | None = None
        self.dtype: str | None = None
        #: FLOPs by module (FlopCounterMode's names: "Global", "Net", "Net.block1.0").
        self.by_module: dict[str, int] | None = None
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
            mode.__enter__()
            self._mode = mode
            tracker = getattr(mode, "mod_tracker", None)
            if entering is not None and tracker is not None:
                tracker._fw_pre_hook(entering, ())
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
            mode.__exit__(None, None, None)
            total = int(mode.get_total_flops())
            self.flops = total if total > 0 else None
            self.by_module = {
                str(k): int(sum(v.values())) for k, v in mode.get_flop_counts().items()
            }
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
            try:
                formula = self.flop_registry.get(func_packet)
                if formula is not None:
                    dtype = _first_float_dtype(args)
                    if dtype is not None:
                        n = int(formula(*args, **kwargs, out_val=out))
                        by = self.traceml_flops_by_dtype
                        by[dtype] = by.get(dtype, 0) + n
            except Exception:  # never into the user's step: the dtype falls back
                pass
            return super()._count_flops(func_packet, out, args, kwargs)

    _COUNTER_CLASS = DtypeFlopCounter
    return _COUNTER_CLASS


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
