"""Settings rows: what the code told torch to do that changes what a step costs, compared exactly.

A setting is the same on every run of the same code, so a change is a fact, never noise: a
change the PyTorch Performance Tuning Guide calls worse regresses (a head that loads its data
in the training process, say) and names the setting and the guide's fix; the way back is
``improved``; a change that is neither (a batch size) regresses as a change to accept, by
updating the baseline. A setting either side did not record makes no row (older summaries,
traceml-ai ones, a run without a DataLoader).

Each setting is one :class:`Setting`: where the summary keeps it, which way is better, the
words of its fix. The rows are named ``settings.<name>``; their ``cause`` heads the report
(gate/causes.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from traceml_ci.gate.metrics import Kind
from traceml_ci.gate.results import Evidence, Row, Status, Tolerance
from traceml_ci.gate.rules import Direction, Rule
from traceml_ci.summary.view import SummaryLike, as_view

#: Row names start with this.
PREFIX = "settings."

_ANY = Rule(direction=Direction.ANY)

#: How a setting's two values compare: +1 the head's is better, -1 worse, 0 only different.
Better = Callable[[Any, Any, Mapping[str, Any]], int]


def _more(b: Any, h: Any, block: Mapping[str, Any]) -> int:
    """More is better (workers, prefetched batches)."""
    if isinstance(b, bool) or isinstance(h, bool) or not all(
        isinstance(x, int) for x in (b, h)
    ):
        return 0
    return (h > b) - (h < b)


def _on(b: Any, h: Any, block: Mapping[str, Any]) -> int:
    """True is better."""
    return (h is True and b is False) - (h is False and b is True)


def _off(b: Any, h: Any, block: Mapping[str, Any]) -> int:
    """False is better (a debugging aid left on)."""
    return -_on(b, h, block)


def _default(b: Any, h: Any, block: Mapping[str, Any]) -> int:
    """torch's default is better than a Python function of one's own (a collate_fn)."""
    return (h == "default") - (b == "default")


def _ranked(rank: Mapping[Any, int]) -> Better:
    """Better by a rank of the values (a value not ranked: only different)."""

    def better(b: Any, h: Any, block: Mapping[str, Any]) -> int:
        rb, rh = rank.get(b), rank.get(h)
        return 0 if rb is None or rh is None else (rh > rb) - (rh < rb)

    return better


#: An optimizer's foreach: left to torch ("default": the multi-tensor path where the tensors
#: allow it) or True run one kernel per group; False a Python loop of per-parameter kernels.
_foreach = _ranked({False: 0, "default": 1, True: 1})
#: fused: only True fuses ("default" is not fused).
_fused = _ranked({False: 0, "default": 0, True: 1})


def _on_a_device(b: Any, h: Any, block: Mapping[str, Any]) -> int:
    """True is better, where there is a device to copy to (pinned memory does nothing
    without one: only different)."""
    return _on(b, h, block) if str(block.get("device") or "cpu") != "cpu" else 0


def _different(b: Any, h: Any, block: Mapping[str, Any]) -> int:
    return 0


def _with_workers(block: Mapping[str, Any]) -> bool:
    n = block.get("num_workers")
    return isinstance(n, int) and not isinstance(n, bool) and n > 0


@dataclass(frozen=True)
class Setting:
    """One setting a summary records. ``block``: keys to the mapping that holds it;
    ``key``: its key there; ``label``: how a cause names it; ``better``: which way is better;
    ``fix``: the guide's advice, said when the head went the worse way; ``applies``: whether
    the setting means anything in that block (a worker setting without workers does not)."""

    name: str
    block: tuple[str, ...]
    key: str
    label: str
    better: Better
    fix: str
    applies: Callable[[Mapping[str, Any]], bool] = lambda block: True
    #: Said when the two values differ and neither is better (``better`` gave 0).
    neutral: str = "no cost here: no device"


#: Where the sampled step's settings are (tracer/counters.py).
_TORCH = ("counters", "settings")

#: The settings compared, in the order their rows come. DataLoader ones are read once from the
#: first DataLoader's iterator (``step_time.dataloader``).
SETTINGS: tuple[Setting, ...] = (
    Setting("dataloader.num_workers", ("step_time", "dataloader"), "num_workers",
            "DataLoader num_workers", _more,
            "load batches in worker processes: raise num_workers (Tuning Guide: enable async "
            "data loading)"),
    Setting("dataloader.batch_size", ("step_time", "dataloader"), "batch_size",
            "DataLoader batch_size", _different,
            "a step does other work now; accepted by updating the baseline"),
    Setting("dataloader.pin_memory", ("step_time", "dataloader"), "pin_memory",
            "DataLoader pin_memory", _on_a_device,
            "pin_memory=True lets host-to-device copies run asynchronously"),
    Setting("dataloader.persistent_workers", ("step_time", "dataloader"), "persistent_workers",
            "DataLoader persistent_workers", _on,
            "persistent_workers=True keeps the workers between epochs instead of starting them "
            "again", _with_workers),
    Setting("dataloader.prefetch_factor", ("step_time", "dataloader"), "prefetch_factor",
            "DataLoader prefetch_factor", _more,
            "a higher prefetch_factor keeps more batches ready", _with_workers),
    Setting("dataloader.collate_fn", ("step_time", "dataloader"), "collate_fn",
            "DataLoader collate_fn", _default,
            "each batch is now assembled by this Python function; torch's default collate "
            "stacks tensors in one op (and into shared memory in workers): keep it where it "
            "does the job", neutral="another function of one's own: accepted as it is"),
    # -- read on the sampled step (tracer/counters.py, ``counters.settings``) ---------------
    Setting("torch.anomaly_detection", _TORCH, "anomaly_detection",
            "autograd anomaly detection", _off,
            "set_detect_anomaly(True) checks every backward op and keeps each forward's "
            "traceback: turn it off outside debugging (Tuning Guide: disable debugging APIs)"),
    Setting("torch.deterministic_algorithms", _TORCH, "deterministic_algorithms",
            "torch.use_deterministic_algorithms", _off,
            "deterministic algorithms trade speed for reproducibility (slower kernels, or an "
            "error where none exists): keep them for runs that need them (Tuning Guide: "
            "disable debugging APIs)"),
    Setting("torch.autograd_profiler", _TORCH, "autograd_profiler",
            "the autograd profiler (or emit_nvtx)", _off,
            "a profiler records every op: keep it out of the training loop (Tuning Guide: "
            "disable debugging APIs)"),
    Setting("torch.cudnn_benchmark", _TORCH, "cudnn_benchmark",
            "torch.backends.cudnn.benchmark", _on_a_device,
            "cudnn.benchmark=True picks the fastest convolution algorithm for fixed input "
            "sizes (Tuning Guide: enable cuDNN auto-tuner)"),
    Setting("torch.matmul_precision", _TORCH, "matmul_precision",
            "float32 matmul precision", _different,
            "float32 matrix products run at another precision (TF32 on a GPU: Tuning Guide, "
            "use TF32); accepted by updating the baseline"),
    Setting("torch.matmul_dtype", _TORCH, "matmul_dtype",
            "the dtype of the step's matrix products", _different,
            "the matrix products run in another dtype: autocast turned on or lost (Tuning "
            "Guide: use mixed precision); accepted by updating the baseline"),
    Setting("torch.grad_scaler", _TORCH, "grad_scaler",
            "a GradScaler around optimizer.step", _different,
            "the loss scaling of float16 autocast was added or removed (Tuning Guide: use mixed "
            "precision and AMP; float16 needs a GradScaler, bfloat16 does not); accepted by "
            "updating the baseline"),
    Setting("optimizer.foreach", _TORCH, "optimizer_foreach",
            "optimizer foreach", _foreach,
            "foreach=False runs a Python loop of per-parameter kernels; leave foreach to torch "
            "(None) or set it True, or fused=True on a GPU (Tuning Guide: use fused or "
            "foreach optimizers)", neutral="the same: foreach is torch's default"),
    Setting("optimizer.fused", _TORCH, "optimizer_fused",
            "optimizer fused", _fused,
            "fused=True runs the whole update in one kernel per group on a GPU (Tuning Guide: "
            "use fused optimizers)", neutral="the same: not fused"),
    Setting("optimizer.capturable", _TORCH, "optimizer_capturable",
            "optimizer capturable", _different,
            "capturable keeps the optimizer's step on the device (for CUDA graphs); accepted "
            "by updating the baseline"),
    Setting("ddp.find_unused_parameters", _TORCH, "ddp_find_unused_parameters",
            "DDP find_unused_parameters", _off,
            "find_unused_parameters=True walks the autograd graph after every forward: only "
            "for models that really leave parameters unused"),
    Setting("ddp.static_graph", _TORCH, "ddp_static_graph",
            "DDP static_graph", _on,
            "static_graph=True lets DDP skip per-step bookkeeping where the graph never "
            "changes"),
    Setting("ddp.gradient_as_bucket_view", _TORCH, "ddp_gradient_as_bucket_view",
            "DDP gradient_as_bucket_view", _on,
            "gradient_as_bucket_view=True saves a copy of every gradient into its bucket"),
    Setting("ddp.bucket_cap_mb", _TORCH, "ddp_bucket_cap_mb",
            "DDP bucket_cap_mb", _different,
            "other bucket sizes overlap communication with backward differently; accepted by "
            "updating the baseline"),
)


def _value(x: Any) -> str:
    return "none" if x is None else str(x)


def _shown(x: Any) -> Any:
    """A setting's value as a row holds it: a number or a string (a flag as its word)."""
    return x if isinstance(x, (int, float, str)) and not isinstance(x, bool) else _value(x)


def setting_rows(base: SummaryLike, head: SummaryLike) -> list[Row]:
    """One row per setting both summaries recorded (and that applies on both sides)."""
    bv, hv = as_view(base), as_view(head)
    rows = []
    for s in SETTINGS:
        b_block, h_block = bv.at(s.block), hv.at(s.block)
        if not (isinstance(b_block, Mapping) and isinstance(h_block, Mapping)):
            continue
        if s.key not in b_block or s.key not in h_block:
            continue
        if not (s.applies(b_block) and s.applies(h_block)):
            continue
        rows.append(_row(s, b_block[s.key], h_block[s.key], h_block))
    return rows


def _row(s: Setting, b: Any, h: Any, head_block: Mapping[str, Any]) -> Row:
    if b == h and type(b) is type(h):
        status, cause, note = Status.OK, "", ""
    else:
        better = s.better(b, h, head_block)
        cause = f"{s.label} {_value(b)} → {_value(h)}"
        if better > 0:
            status, note = Status.IMPROVED, cause
        elif better < 0 or s.better is _different:
            status, note = Status.REGRESSED, f"{cause}: {s.fix}"
        else:  # different, and the guide calls neither better here (pin_memory on a CPU)
            status, note = Status.OK, f"{cause} ({s.neutral})"
    return Row(PREFIX + s.name, _shown(b), _shown(h), None, Tolerance(_ANY, Kind.LABEL, ""),
               status, note=note, cause=cause if status is not Status.OK else "",
               evidence=Evidence.SETTING)
