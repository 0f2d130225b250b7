"""Typed model of final_summary.json, the writer's side: ``Summary.to_dict`` lays out its keys.
Readers use summary/view.py's SummaryView."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from traceml_ci.summary.keys import PHASES, SCHEMA_VERSION, TOOL_NAME, phases_in

__all__ = ["PHASES", "SCHEMA_VERSION", "TOOL_NAME"]  # re-exported; defined in keys.py


class StepTimeLabel(str, Enum):
    """Where a step's time went, as ``step_time.label`` says it (docs/diagnoses.md)."""

    INPUT_BOUND = "INPUT_BOUND"
    H2D_BOUND = "H2D_BOUND"
    COMPUTE_BOUND = "COMPUTE_BOUND"
    OPTIMIZER_BOUND = "OPTIMIZER_BOUND"
    OVERHEAD_BOUND = "OVERHEAD_BOUND"
    BALANCED = "BALANCED"
    INSUFFICIENT_DATA = "INSUFFICIENT_DATA"


class MemoryLabel(str, Enum):
    """What the step memory did, as ``step_memory.label`` says it (docs/diagnoses.md)."""

    BALANCED = "BALANCED"
    MEMORY_GROWTH = "MEMORY_GROWTH"
    HIGH_PRESSURE = "HIGH_PRESSURE"
    FRAGMENTATION = "FRAGMENTATION"
    NO_DATA = "NO_DATA"


class Severity(str, Enum):
    """How much a diagnosis matters."""

    INFO = "info"
    WARN = "warn"
    CRIT = "crit"


class RunStatus(str, Enum):
    """How the traced run ended (``run.status``)."""

    COMPLETED = "completed"
    CRASHED = "crashed"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Diagnosis:
    area: str  # "step_time" | "step_memory" | "gpu" | "distributed"
    kind: str
    severity: Severity
    message: str
    next_step: str


@dataclass(frozen=True)
class Spread:
    """Median and interquartile range across windows of consecutive steps."""

    median: float
    iqr: float


@dataclass(frozen=True)
class Noise:
    windows: int
    window_steps: int
    pct: dict[str, Spread]  # phase -> spread of that phase's pct across windows (pp)
    step_ms: Spread


@dataclass(frozen=True)
class StepMs:
    median: float | None
    p10: float | None
    p90: float | None
    mean: float | None


@dataclass(frozen=True)
class Throughput:
    steps_per_s: float | None
    samples_per_s: float | None
    batch_size: int | None
    #: Samples per (optimizer) step: all micro-batches of an accumulation step.
    samples_per_step: float | None = None


@dataclass(frozen=True)
class BetweenSteps:
    """Wall time after the warmup that no step covers (evaluation, checkpointing, logging),
    and the part of it evaluation hooks saw (HF ``on_evaluate``, Lightning validation)."""

    #: Wall seconds measured: from the end of a step just after the warmup to the end of one
    #: of the last steps (read ~10 times a second, between steps).
    wall_s: float
    #: Seconds of ``wall_s`` in no step, and their percent of it.
    between_s: float
    between_pct: float
    #: Seconds of ``wall_s`` in evaluations, their percent, and how many evaluations ran in it;
    #: None where nothing tells an evaluation apart (a loop's own, between its trace_steps).
    eval_s: float | None = None
    eval_pct: float | None = None
    evals: int | None = None


@dataclass(frozen=True)
class DataLoaderSettings:
    """The DataLoader's own settings, as its iterator had them; ``device`` is the run's device
    type (``cpu``, ``cuda``, ...), which decides whether pinned memory can help."""

    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    batch_size: int | None
    device: str
    #: "default" (torch's collate), else the function given, as ``module.name``.
    collate_fn: str | None = None


@dataclass(frozen=True)
class StepTime:
    diagnosis: StepTimeLabel
    #: phase -> percent of step time; serialised as <phase>_pct. ``wait`` only where the run
    #: used a process group, ``h2d`` only where it copied to a device (keys.phases_of).
    pct: dict[str, float | None]
    steps_total: int
    steps_analyzed: int
    warmup_steps: int
    outlier_steps: int
    step_ms: StepMs
    phase_ms: dict[str, float | None]  # phase -> median ms per step
    throughput: Throughput
    clock: str  # "host" | "device_event"
    noise: Noise | None
    dataloader: DataLoaderSettings | None = None
    #: Time between steps over the analysed part of the run (None: too short to measure).
    between_steps: BetweenSteps | None = None
    #: The job's CPU ms per analysed step (its own threads; host clock only). Left out of the
    #: JSON when None (a device-clock run, an older tracer).
    cpu_ms: float | None = None
    #: The training thread's wall time per analysed step split three ways (host clock with
    #: schedstats; left out of the JSON when None): ``on_cpu_ms``, ``cpu_wait_ms`` (runnable,
    #: waiting for a CPU), ``blocked_ms`` (neither).
    thread: dict[str, float] | None = None


@dataclass(frozen=True)
class StepMemory:
    diagnosis: MemoryLabel
    device: str
    peak_allocated_mb: float | None
    peak_reserved_mb: float | None
    device_total_mb: float | None
    peak_rss_mb: float | None
    growth_mb_per_1k_steps: float | None
    growth_basis: str | None  # "allocated" | "rss" | None
    alloc_retries: int | None
    ooms: int | None
    samples: int
    #: Peak RSS while the tracer ran minus RSS when it started: the job's own host memory,
    #: whatever ran before it in the same process (``peak_rss_mb`` is the process's lifetime
    #: high-water mark). The pytest plugin gates this one.
    peak_job_rss_mb: float | None = None


@dataclass(frozen=True)
class GpuUtil:
    """What the NVML sampler saw (tracer/gpu_util.py), every ``SAMPLE_INTERVAL_S``."""

    util_mean_pct: float | None = None
    util_p10_pct: float | None = None
    mem_used_peak_mb: float | None = None
    samples: int = 0
    #: The GPU's core temperature, highest and mean over the samples (degrees C); left out of
    #: the JSON where not read (no NVML, an older tracer).
    temp_max_c: float | None = None
    temp_mean_c: float | None = None
    #: The temperature at which the driver starts slowing the GPU's clocks (NVML's slowdown
    #: threshold), where the device reports one.
    temp_slowdown_c: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = _rounded(dataclasses.asdict(self), 2)
        for key in OPTIONAL_GPU_KEYS:
            if out[key] is None:
                del out[key]
        return out


#: The ``gpu`` block's keys written only when known (summaries before them stay as they were).
OPTIONAL_GPU_KEYS = ("temp_max_c", "temp_mean_c", "temp_slowdown_c")


@dataclass(frozen=True)
class Contention:
    """How contended the CPU was while the run was traced (tracer/contention.py); None where a
    figure cannot be read on this platform."""

    runqueue_wait_pct: float | None = None  # main thread runnable but waiting, % of wall time
    involuntary_switches_per_s: float | None = None
    load_per_cpu: float | None = None  # 1-minute load average / CPU count, at finish
    cpu_steal_pct: float | None = None  # hypervisor steal, % of all CPU time


@dataclass(frozen=True)
class RunInfo:
    name: str
    status: RunStatus
    started_at: str  # ISO 8601, UTC
    duration_s: float
    mode: str  # "auto" | "manual" | "zero-change"
    rank: int = 0
    world_size: int = 1
    contention: Contention | None = None
    #: Distributed runs only (None, and left out of the JSON, otherwise).
    local_rank: int | None = None
    node_rank: int | None = None
    host: str | None = None


@dataclass(frozen=True)
class Efficiency:
    """Compute efficiency from one counted step (tracer/flops.py). ``compute_ms``: the median
    forward + backward + optimizer ms the FLOPs are divided by."""

    flops_per_step: float | None = None
    compute_ms: float | None = None
    achieved_tflops: float | None = None
    dtype: str | None = None
    peak_tflops: float | None = None
    mfu_pct: float | None = None
    #: Why the figures are null: not counted (torch.compile, no warmup step, the counter failed).
    not_counted: str | None = None


@dataclass(frozen=True)
class Summary:
    run: RunInfo
    env: dict[str, Any]
    step_time: StepTime
    step_memory: StepMemory
    gpu: GpuUtil = field(default_factory=GpuUtil)
    diagnoses: tuple[Diagnosis, ...] = ()
    tool_version: str = ""
    schema_version: str = SCHEMA_VERSION
    efficiency: Efficiency | None = None
    #: Sampled per-module forward times: {sampled_steps, every_s, forward_ms, forward: [...]}.
    modules: dict[str, Any] | None = None
    #: Deterministic counters of one sampled step: scalar reads, optimizer, leak, FLOPs by
    #: module (docs/summary.md); None when not measured.
    counters: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document, keys in a stable, readable order."""
        st = self.step_time
        step_time: dict[str, Any] = {"diagnosis": st.diagnosis.value}
        phases = phases_in(st.pct)
        for phase in phases:
            step_time[f"{phase}_pct"] = _round(st.pct.get(phase), 2)
        step_time.update(
            steps_total=st.steps_total,
            steps_analyzed=st.steps_analyzed,
            warmup_steps=st.warmup_steps,
            outlier_steps=st.outlier_steps,
            step_ms=_rounded(dataclasses.asdict(st.step_ms), 4),
            phase_ms={p: _round(st.phase_ms.get(p), 4) for p in phases},
            throughput=_rounded(dataclasses.asdict(st.throughput), 3),
            clock=st.clock,
            noise=_noise_dict(st.noise),
            dataloader=None if st.dataloader is None else dataclasses.asdict(st.dataloader),
            between_steps=None
            if st.between_steps is None
            else _rounded(dataclasses.asdict(st.between_steps), 3),
        )
        if st.cpu_ms is not None:
            step_time["cpu_ms"] = _round(st.cpu_ms, 4)
        if st.thread is not None:
            step_time["thread"] = _rounded(dict(st.thread), 4)
        mem = dataclasses.asdict(self.step_memory)
        mem["diagnosis"] = self.step_memory.diagnosis.value
        return {
            "schema_version": self.schema_version,
            "tool": {"name": TOOL_NAME, "version": self.tool_version},
            "run": {
                **{
                    k: v
                    for k, v in dataclasses.asdict(self.run).items()
                    if v is not None or k not in ("local_rank", "node_rank", "host")
                },
                "status": self.run.status.value,
                "duration_s": round(self.run.duration_s, 3),
                "contention": _contention_dict(self.run.contention),
            },
            "env": dict(self.env),
            "step_time": step_time,
            "step_memory": _rounded(mem, 2),
            "gpu": self.gpu.to_dict(),
            "diagnoses": [
                {**dataclasses.asdict(d), "severity": d.severity.value} for d in self.diagnoses
            ],
            **(
                {} if self.efficiency is None else {"efficiency": _efficiency_dict(self.efficiency)}
            ),
            **({} if self.modules is None else {"modules": self.modules}),
            **({} if self.counters is None else {"counters": self.counters}),
        }


def _efficiency_dict(e: Efficiency) -> dict[str, Any]:
    out = dataclasses.asdict(e)
    if out["not_counted"] is None:
        del out["not_counted"]
    for key, digits in (("compute_ms", 4), ("achieved_tflops", 6), ("mfu_pct", 2)):
        out[key] = _round(out[key], digits)
    return out


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)


def _rounded(d: dict[str, Any], digits: int) -> dict[str, Any]:
    return {k: round(v, digits) if isinstance(v, float) else v for k, v in d.items()}


def _contention_dict(c: Contention | None) -> dict[str, float | None] | None:
    return None if c is None else _rounded(dataclasses.asdict(c), 3)


def _noise_dict(noise: Noise | None) -> dict[str, Any] | None:
    if noise is None:
        return None
    return {
        "windows": noise.windows,
        "window_steps": noise.window_steps,
        "pct": {
            p: {"median": round(s.median, 2), "iqr": round(s.iqr, 2)} for p, s in noise.pct.items()
        },
        "step_ms": {"median": round(noise.step_ms.median, 4), "iqr": round(noise.step_ms.iqr, 4)},
    }
