"""Build a Summary from what the tracer recorded: robust statistics, noise windows, diagnoses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from traceml_ci._version import __version__
from traceml_ci.summary import stats
from traceml_ci.summary.diagnose import diagnose_gpu, diagnose_memory, diagnose_step_time
from traceml_ci.summary.keys import MEASURED_PHASES, phases_of
from traceml_ci.summary.model import (
    BetweenSteps,
    DataLoaderSettings,
    Efficiency,
    GpuUtil,
    MemoryLabel,
    Noise,
    RunInfo,
    Spread,
    StepMemory,
    StepMs,
    StepTime,
    StepTimeLabel,
    Summary,
    Throughput,
)
from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS, Thresholds


@dataclass
class StepSeries:
    """Per-step milliseconds of the analysed (post-warmup) steps, in order.

    For very long runs this is a uniform sample: every ``stride``-th step.
    """

    step_ms: Sequence[float]
    phase_ms: dict[str, Sequence[float]]  # keys: MEASURED_PHASES (``wait`` may be left out)
    stride: int = 1
    #: Per-step peak allocated / reserved MB (device runs only).
    allocated_mb: Sequence[float] | None = None
    reserved_mb: Sequence[float] | None = None


@dataclass
class RunRecord:
    """Everything the tracer hands to the summary layer at finish; plain data, no torch."""

    run: RunInfo
    env: dict[str, Any]
    clock: str
    steps_total: int
    warmup_steps: int
    series: StepSeries
    batch_size: int | None = None
    #: Samples per step, averaged over the analysed steps (None: unknown).
    samples_per_step: float | None = None
    #: The first DataLoader's settings (None: no DataLoader seen).
    dataloader: DataLoaderSettings | None = None
    memory_device: str = "cpu"
    #: (step number, RSS MB) samples taken at most every ~100 ms, after warmup.
    rss_samples: Sequence[tuple[int, float]] = ()
    peak_rss_mb: float | None = None
    #: Peak RSS during the run above RSS at its start: its own memory (see StepMemory).
    peak_job_rss_mb: float | None = None
    system_total_mb: float | None = None
    device_total_mb: float | None = None
    alloc_retries: int | None = None
    ooms: int | None = None
    gpu: GpuUtil = field(default_factory=GpuUtil)
    #: FLOPs of one counted step (None: not counted) and the dtype its ops ran in.
    flops_per_step: float | None = None
    flops_dtype: str | None = None
    #: Why there is no FLOP count (tracer/flops.py), for a section of nulls that says so.
    flops_not_counted: str | None = None
    #: Sampled per-module forward times (tracer/modules.py), already in the summary's shape.
    modules: dict[str, Any] | None = None
    #: Zero-change mode: backward passes seen in a run with no step at all -- no
    #: ``optimizer.step()`` delimited one (a hand-written update, ``p -= lr * p.grad``).
    backward_without_steps: int = 0
    #: Wall time after warmup that no step covers, and evaluation's part (None: unmeasured).
    between_steps: BetweenSteps | None = None
    #: Deterministic counters of one sampled step (tracer/counters.py), in the summary's shape.
    counters: dict[str, Any] | None = None
    #: The job's CPU ms per analysed step (tracer/cputime.py); host clock only, else None.
    cpu_ms: float | None = None
    #: The training thread's wall time per analysed step, split (tracer/cputime.ThreadSplit:
    #: on_cpu_ms, cpu_wait_ms, blocked_ms); host clock with schedstats only, else None.
    thread: dict[str, float] | None = None
    #: The run used a process group: its summary has the wait phase (time in collectives).
    waits: bool = False
    #: The run copied tensors from host to device inside its steps: its summary has the h2d
    #: phase.
    copies: bool = False


#: The note a step-less zero-change run gets when it ran backward passes: why, and what to do.
NO_OPTIMIZER_STEP = (
    "No steps: {n} backward passes ran, but never an optimizer.step(), which is where a "
    "script traced without changes (traceml-ci run) has its steps end."
)
NO_OPTIMIZER_STEP_NEXT = (
    "A hand-written update (p -= lr * p.grad) is not an optimizer step: wrap the loop body "
    "in `with traceml_ci.trace_step(model):` (import traceml_ci), or step a torch.optim "
    "optimizer."
)


def build_summary(record: RunRecord, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> Summary:
    """Turn a RunRecord into a Summary. Pure function: same record, same summary."""
    step_time = _step_time(record, thresholds)
    step_memory, mem_diags = _step_memory(record, thresholds)
    st_diags = diagnose_step_time(
        step_time.pct,
        step_time.steps_analyzed,
        step_time.warmup_steps,
        thresholds,
        dataloader=record.dataloader,
        device=_device_type(record.memory_device),
    )
    step_time = _with_label(step_time, StepTimeLabel(st_diags[0].kind))
    if record.backward_without_steps and not record.steps_total:
        st_diags[0] = replace(
            st_diags[0],
            message=NO_OPTIMIZER_STEP.format(n=record.backward_without_steps),
            next_step=NO_OPTIMIZER_STEP_NEXT,
        )
    return Summary(
        run=record.run,
        env=record.env,
        step_time=step_time,
        step_memory=step_memory,
        gpu=record.gpu,
        diagnoses=tuple(st_diags + mem_diags + diagnose_gpu(record.gpu, thresholds)),
        tool_version=__version__,
        efficiency=_efficiency(record, step_time),
        modules=record.modules,
        counters=record.counters,
    )


def _efficiency(record: RunRecord, st: StepTime) -> Efficiency | None:
    """FLOPs per step over the median compute time: achieved TFLOP/s, and MFU where the
    device's peak for the dtype the counted ops ran in is known (summary/peaks.py). Not
    counted: nulls and the reason; None for a run that never tried (an older tracer's record)."""
    from traceml_ci.summary.peaks import peak_tflops

    flops = record.flops_per_step
    if not flops:
        if record.flops_not_counted is None:
            return None
        return Efficiency(not_counted=record.flops_not_counted)
    parts = [st.phase_ms.get(p) for p in ("forward", "backward", "optimizer")]
    compute_ms = sum(x for x in parts if x is not None) if any(parts) else None
    achieved = flops / (compute_ms / 1000.0) / 1e12 if compute_ms else None
    name = record.env.get("device_name") if _device_type(record.memory_device) != "cpu" else None
    peak = peak_tflops(name, record.flops_dtype)
    mfu = 100.0 * achieved / peak if achieved is not None and peak else None
    return Efficiency(float(flops), compute_ms, achieved, record.flops_dtype, peak, mfu)


def _with_label(st: StepTime, label: StepTimeLabel) -> StepTime:
    return replace(st, diagnosis=label)


def _device_type(device: str) -> str:
    """``cuda:0`` -> ``cuda``."""
    return device.split(":", 1)[0] or "cpu"


def _measured(series: StepSeries, phases: Sequence[str]) -> dict[str, Sequence[float]]:
    """The measured phases' columns of the summary's ``phases`` (``wait`` and ``h2d`` only where
    the run had them; a series without their columns -- a record built by hand -- spent none)."""
    n = len(series.step_ms)
    optional = MEASURED_PHASES[4:]  # the slots after the four every run has
    return {
        p: series.phase_ms[p] if p in series.phase_ms or p not in optional else [0.0] * n
        for p in phases
        if p != "other"
    }


def _other_ms(series: StepSeries, measured: dict[str, Sequence[float]]) -> list[float]:
    phases = list(measured.values())
    return [max(0.0, step - sum(ph[i] for ph in phases)) for i, step in enumerate(series.step_ms)]


def _pct_of(indices: Sequence[int], cols: dict[str, Sequence[float]]) -> dict[str, float]:
    """Share of each phase (the keys of ``cols``) in the summed time of ``indices`` steps; they
    add up to 100."""
    sums = {p: sum(cols[p][i] for i in indices) for p in cols}
    total = sum(sums.values())
    if total <= 0:
        return {p: (100.0 if p == "other" else 0.0) for p in cols}
    return {p: 100.0 * sums[p] / total for p in cols}


def _step_time(record: RunRecord, th: Thresholds) -> StepTime:
    series = record.series
    n = len(series.step_ms)
    phases = phases_of(record.waits, record.copies)
    empty_ms = StepMs(None, None, None, None)
    if n == 0:
        return StepTime(
            diagnosis=StepTimeLabel.INSUFFICIENT_DATA,
            pct={p: None for p in phases},
            steps_total=record.steps_total,
            steps_analyzed=0,
            warmup_steps=record.warmup_steps,
            outlier_steps=0,
            step_ms=empty_ms,
            phase_ms={p: None for p in phases},
            throughput=Throughput(None, None, record.batch_size, record.samples_per_step),
            clock=record.clock,
            noise=None,
            dataloader=record.dataloader,
        )
    cols = _measured(series, phases)
    cols["other"] = _other_ms(series, cols)
    keep = stats.tukey_keep_mask(series.step_ms, th.outlier_fence_k)
    kept = [i for i in range(n) if keep[i]]
    pct = _pct_of(kept, cols)

    ordered = sorted(series.step_ms)
    mean = sum(series.step_ms) / n
    step_ms = StepMs(
        median=stats.percentile(ordered, 50),
        p10=stats.percentile(ordered, 10),
        p90=stats.percentile(ordered, 90),
        mean=mean,
    )
    steps_per_s = 1000.0 / mean if mean > 0 else None
    per_step = record.samples_per_step or record.batch_size
    samples_per_s = steps_per_s * per_step if steps_per_s is not None and per_step else None
    return StepTime(
        diagnosis=StepTimeLabel.BALANCED,  # replaced by build_summary
        pct=pct,
        steps_total=record.steps_total,
        steps_analyzed=n * series.stride,
        warmup_steps=record.warmup_steps,
        outlier_steps=(n - len(kept)) * series.stride,
        step_ms=step_ms,
        phase_ms={p: stats.median(cols[p]) for p in phases},
        throughput=Throughput(steps_per_s, samples_per_s, record.batch_size, per_step),
        clock=record.clock,
        noise=_noise(kept, cols, series.step_ms, th),
        dataloader=record.dataloader,
        between_steps=record.between_steps,
        cpu_ms=record.cpu_ms,
        thread=record.thread,
    )


def _noise(
    kept: Sequence[int], cols: dict[str, Sequence[float]], step_ms: Sequence[float], th: Thresholds
) -> Noise | None:
    """Each pct over consecutive windows of kept steps: how much it moves within one run."""
    bounds = stats.windows(len(kept), th.noise_windows, th.noise_min_window)
    if not bounds:
        return None
    per_window = [_pct_of(kept[a:b], cols) for a, b in bounds]
    window_medians = [stats.median([step_ms[i] for i in kept[a:b]]) for a, b in bounds]
    return Noise(
        windows=len(bounds),
        window_steps=bounds[0][1] - bounds[0][0],
        pct={
            p: Spread(
                stats.median([w[p] for w in per_window]), stats.iqr([w[p] for w in per_window])
            )
            for p in cols
        },
        step_ms=Spread(stats.median(window_medians), stats.iqr(window_medians)),
    )


def _growth(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """(rise from first to last quarter of samples, starting level, Theil-Sen slope per x)."""
    q = max(1, len(ys) // 4)
    start = stats.median(ys[:q])
    rise = stats.median(ys[-q:]) - start
    return rise, start, stats.theil_sen_slope(xs, ys)


def _step_memory(record: RunRecord, th: Thresholds) -> tuple[StepMemory, list]:
    series = record.series
    alloc = list(series.allocated_mb or [])
    reserved = list(series.reserved_mb or [])
    peak_alloc = max(alloc) if alloc else None
    peak_reserved = max(reserved) if reserved else None
    growth = start = slope = None
    if alloc:
        basis = "allocated"
        xs = [float(i * series.stride) for i in range(len(alloc))]
        samples = len(alloc)
        if samples >= th.min_memory_samples:
            growth, start, slope = _growth(xs, alloc)
        pressure_peak, pressure_total = peak_reserved, record.device_total_mb
    else:
        basis = "rss" if record.rss_samples else None
        samples = len(record.rss_samples)
        if samples >= th.min_memory_samples:
            xs = [float(s) for s, _ in record.rss_samples]
            growth, start, slope = _growth(xs, [mb for _, mb in record.rss_samples])
        pressure_peak, pressure_total = record.peak_rss_mb, record.system_total_mb
    diags = diagnose_memory(
        samples=samples,
        growth_mb=growth,
        start_mb=start,
        basis=basis,
        peak_mb=pressure_peak,
        total_mb=pressure_total,
        peak_allocated_mb=peak_alloc,
        peak_reserved_mb=peak_reserved,
        ooms=record.ooms,
        th=th,
    )
    return (
        StepMemory(
            diagnosis=MemoryLabel(diags[0].kind),
            device=record.memory_device,
            peak_allocated_mb=peak_alloc,
            peak_reserved_mb=peak_reserved,
            device_total_mb=record.device_total_mb,
            peak_rss_mb=record.peak_rss_mb,
            peak_job_rss_mb=record.peak_job_rss_mb,
            growth_mb_per_1k_steps=None if slope is None else slope * 1000.0,
            growth_basis=basis,
            alloc_retries=record.alloc_retries,
            ooms=record.ooms,
            samples=samples,
        ),
        diags,
    )
