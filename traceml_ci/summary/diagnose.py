"""Diagnosis rules: from percentages and memory figures to a label, a message and a next step."""

from __future__ import annotations

from collections.abc import Mapping

from traceml_ci.summary.model import (
    DataLoaderSettings,
    Diagnosis,
    GpuUtil,
    MemoryLabel,
    Severity,
    StepTimeLabel,
)
from traceml_ci.summary.thresholds import Thresholds

NEXT_STEP: dict[str, str] = {
    StepTimeLabel.INPUT_BOUND: (
        "Look at the input pipeline: raise DataLoader num_workers, set pin_memory=True and "
        "persistent_workers=True, and time the dataset's __getitem__ (decoding, augmentation, I/O)."
    ),
    StepTimeLabel.H2D_BOUND: (
        "Make the host-to-device copies cheaper: set DataLoader pin_memory=True and copy with "
        ".to(device, non_blocking=True), copy the batch once (not tensor by tensor), send "
        "compact dtypes (uint8 images) and convert on the device, or keep a small dataset on "
        "the device."
    ),
    StepTimeLabel.COMPUTE_BOUND: (
        "Compute dominates, the healthy case. To go faster: mixed precision (torch.autocast), "
        "torch.compile, larger batches, fused kernels; open torch.profiler or Nsight Systems to "
        "find the slowest kernels."
    ),
    StepTimeLabel.OPTIMIZER_BOUND: (
        "Use a fused or foreach optimizer (e.g. AdamW(fused=True)), fewer parameter groups, and "
        "check step hooks and LR schedulers for per-step host work."
    ),
    StepTimeLabel.OVERHEAD_BOUND: (
        "Time goes outside forward, backward and the optimizer: look for host syncs (.item(), "
        ".cpu(), printing tensors), logging and metrics inside the step; do them every N steps."
    ),
    StepTimeLabel.BALANCED: (
        "No single phase dominates; gate it against a baseline with `traceml-ci diff` to see "
        "where time moves."
    ),
    StepTimeLabel.INSUFFICIENT_DATA: (
        "Run more steps: the statistics need at least {min_steps} steps{after_warmup}."
    ),
    MemoryLabel.MEMORY_GROWTH: (
        "Look for tensors kept across steps: losses accumulated without .item() or .detach(), "
        "growing caches or lists of outputs; compare torch.cuda.memory_snapshot() early and late."
    ),
    MemoryLabel.HIGH_PRESSURE: (
        "Close to the memory limit: lower the batch size, use activation checkpointing or mixed "
        "precision, or shard optimizer state."
    ),
    MemoryLabel.FRAGMENTATION: (
        "The caching allocator holds far more than is allocated: try "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and avoid varying tensor shapes."
    ),
    MemoryLabel.BALANCED: "Memory is steady; nothing to do.",
    MemoryLabel.NO_DATA: "No memory samples were taken: the run had too few steps.",
}


def input_next_step(settings: DataLoaderSettings | None, device: str = "cpu") -> str:
    """INPUT_BOUND's next step, from the DataLoader's own settings: only the changes that can
    help this run (pinned memory only speeds copies to an accelerator; persistent workers only
    matter with workers, and only if not already set)."""
    if settings is None:  # no DataLoader seen (manual mode, a hand-written loader)
        hints = ["raise DataLoader num_workers", "set persistent_workers=True"]
        if device != "cpu":
            hints.insert(1, "set pin_memory=True")
        return (
            f"Look at the input pipeline: {', '.join(hints)}, and time the dataset's __getitem__ "
            "(decoding, augmentation, I/O)."
        )
    hints = []
    if settings.num_workers == 0:
        hints.append(
            "num_workers=0: every batch is loaded in the training process, between steps; "
            "set DataLoader num_workers (e.g. 4) to load batches in parallel"
        )
    else:
        hints.append(f"num_workers={settings.num_workers} do not keep up: raise it")
        if not settings.persistent_workers:
            hints.append("set persistent_workers=True, so workers outlive each epoch")
    if device != "cpu" and not settings.pin_memory:
        hints.append("set pin_memory=True for faster copies to the device")
    hints.append("time the dataset's __getitem__ (decoding, augmentation, I/O)")
    return "Look at the input pipeline: " + "; ".join(hints) + "."


def h2d_next_step(settings: DataLoaderSettings | None) -> str:
    """H2D_BOUND's next step: pinned memory first where the loader does not pin."""
    if settings is not None and not settings.pin_memory:
        return (
            "The DataLoader does not pin its batches (pin_memory=False): set pin_memory=True "
            "and copy with .to(device, non_blocking=True); then copy the batch once (not "
            "tensor by tensor), send compact dtypes (uint8 images) and convert on the device."
        )
    return NEXT_STEP[StepTimeLabel.H2D_BOUND]


def _severity_for_share(share: float, th: Thresholds) -> Severity:
    return Severity.CRIT if share >= th.critical_pct else Severity.WARN


def diagnose_step_time(
    pct: Mapping[str, float | None],
    steps_analyzed: int,
    warmup_steps: int,
    th: Thresholds,
    *,
    dataloader: DataLoaderSettings | None = None,
    device: str = "cpu",
) -> list[Diagnosis]:
    """All step-time diagnoses that apply, the primary one first. ``dataloader`` and ``device``
    (a device type: ``cpu``, ``cuda``, ...) shape INPUT_BOUND's next step.

    Priority when several apply: INPUT_BOUND > H2D_BOUND > OVERHEAD_BOUND > OPTIMIZER_BOUND >
    COMPUTE_BOUND, because waiting on data, on copies or on the host is wasted device time,
    while compute is the work. H2D_BOUND only where the summary has the h2d phase.
    """
    area = "step_time"
    if steps_analyzed < th.min_steps or pct.get("dataloader") is None:
        # "after the 0 warmup steps" said nothing true: with no warmup, say none.
        after_warmup = (
            "" if warmup_steps <= 0
            else f" after the {warmup_steps} warmup step{'' if warmup_steps == 1 else 's'}"
        )
        counted = "steps after warmup" if warmup_steps > 0 else "steps"
        msg = f"Only {steps_analyzed} {counted}; at least {th.min_steps} are needed."
        nxt = NEXT_STEP[StepTimeLabel.INSUFFICIENT_DATA].format(
            min_steps=th.min_steps, after_warmup=after_warmup
        )
        return [Diagnosis(area, StepTimeLabel.INSUFFICIENT_DATA.value, Severity.WARN, msg, nxt)]

    p = {k: float(v or 0.0) for k, v in pct.items()}
    compute = p["forward"] + p["backward"]
    found: list[Diagnosis] = []
    checks = [
        (StepTimeLabel.INPUT_BOUND, p["dataloader"], th.input_bound_pct, "Waiting for data"),
        (
            StepTimeLabel.H2D_BOUND,
            p.get("h2d", 0.0),
            th.h2d_bound_pct,
            "Copying tensors from host to device",
        ),
        (
            StepTimeLabel.OVERHEAD_BOUND,
            p["other"],
            th.overhead_bound_pct,
            "Time outside forward, backward and the optimizer",
        ),
        (
            StepTimeLabel.OPTIMIZER_BOUND,
            p["optimizer"],
            th.optimizer_bound_pct,
            "The optimizer step",
        ),
    ]
    for label, share, limit, what in checks:
        if share >= limit:
            msg = f"{what} is {share:.1f}% of step time (threshold {limit:g}%)."
            if label is StepTimeLabel.INPUT_BOUND:
                nxt = input_next_step(dataloader, device)
            elif label is StepTimeLabel.H2D_BOUND:
                nxt = h2d_next_step(dataloader)
            else:
                nxt = NEXT_STEP[label]
            found.append(Diagnosis(area, label.value, _severity_for_share(share, th), msg, nxt))
    if compute >= th.compute_bound_pct:
        limit = th.compute_bound_pct
        msg = f"Forward + backward is {compute:.1f}% of step time (threshold {limit:g}%)."
        found.append(
            Diagnosis(
                area,
                StepTimeLabel.COMPUTE_BOUND.value,
                Severity.INFO,
                msg,
                NEXT_STEP[StepTimeLabel.COMPUTE_BOUND],
            )
        )
    if not found:
        top = max(p, key=lambda k: p[k])
        msg = f"No phase dominates; the largest is {top} at {p[top]:.1f}%."
        found.append(
            Diagnosis(
                area,
                StepTimeLabel.BALANCED.value,
                Severity.INFO,
                msg,
                NEXT_STEP[StepTimeLabel.BALANCED],
            )
        )
    return found


def diagnose_memory(
    *,
    samples: int,
    growth_mb: float | None,
    start_mb: float | None,
    basis: str | None,
    peak_mb: float | None,
    total_mb: float | None,
    peak_allocated_mb: float | None,
    peak_reserved_mb: float | None,
    ooms: int | None,
    th: Thresholds,
) -> list[Diagnosis]:
    """All memory diagnoses that apply, the primary one first (pressure > fragmentation > growth).

    ``growth_mb`` is the rise from the first to the last quarter of the analysed steps, of
    ``basis`` (peak allocated on a GPU, RSS on CPU); ``peak_mb``/``total_mb`` of that same memory.
    """
    area = "step_memory"
    if samples < th.min_memory_samples:
        return [
            Diagnosis(
                area,
                MemoryLabel.NO_DATA.value,
                Severity.INFO,
                f"Only {samples} memory samples.",
                NEXT_STEP[MemoryLabel.NO_DATA],
            )
        ]
    found: list[Diagnosis] = []
    if ooms:
        found.append(
            Diagnosis(
                area,
                MemoryLabel.HIGH_PRESSURE.value,
                Severity.CRIT,
                f"{ooms} out-of-memory errors were raised.",
                NEXT_STEP[MemoryLabel.HIGH_PRESSURE],
            )
        )
    elif peak_mb is not None and total_mb and peak_mb >= th.high_pressure_fraction * total_mb:
        found.append(
            Diagnosis(
                area,
                MemoryLabel.HIGH_PRESSURE.value,
                Severity.CRIT,
                f"Peak {peak_mb:.0f} MB is {100 * peak_mb / total_mb:.0f}% of {total_mb:.0f} MB.",
                NEXT_STEP[MemoryLabel.HIGH_PRESSURE],
            )
        )
    if (
        peak_allocated_mb is not None
        and peak_reserved_mb is not None
        and peak_reserved_mb >= th.fragmentation_ratio * max(peak_allocated_mb, 1e-9)
        and peak_reserved_mb - peak_allocated_mb >= th.fragmentation_min_mb
    ):
        found.append(
            Diagnosis(
                area,
                MemoryLabel.FRAGMENTATION.value,
                Severity.WARN,
                f"Reserved {peak_reserved_mb:.0f} MB vs allocated "
                f"{peak_allocated_mb:.0f} MB at peak.",
                NEXT_STEP[MemoryLabel.FRAGMENTATION],
            )
        )
    if (
        growth_mb is not None
        and growth_mb >= th.growth_min_mb
        and growth_mb >= th.growth_min_fraction * max(start_mb or 0.0, 0.0)
    ):
        found.append(
            Diagnosis(
                area,
                MemoryLabel.MEMORY_GROWTH.value,
                Severity.WARN,
                f"{basis} memory grew by {growth_mb:.0f} MB over the run "
                f"(from {start_mb or 0:.0f} MB).",
                NEXT_STEP[MemoryLabel.MEMORY_GROWTH],
            )
        )
    if not found:
        found.append(
            Diagnosis(
                area,
                MemoryLabel.BALANCED.value,
                Severity.INFO,
                "No growth, pressure or fragmentation.",
                NEXT_STEP[MemoryLabel.BALANCED],
            )
        )
    return found


#: The GPU diagnoses (area ``gpu``): from the NVML sampler's figures; none without them.
LOW_GPU_UTILIZATION = "LOW_GPU_UTILIZATION"
HIGH_GPU_TEMPERATURE = "HIGH_GPU_TEMPERATURE"
GPU_NEXT_STEP: dict[str, str] = {
    LOW_GPU_UTILIZATION: (
        "The GPU ran no kernel most of the time: see which phase the step spends outside "
        "forward and backward (INPUT_BOUND, H2D_BOUND, OVERHEAD_BOUND above, the wait phase "
        "of a distributed run); then larger batches, CUDA graphs or torch.compile for many "
        "small kernels."
    ),
    HIGH_GPU_TEMPERATURE: (
        "The GPU ran hot enough to slow its clocks: check the cooling and airflow of its host "
        "(nvidia-smi -q -d TEMPERATURE,PERFORMANCE shows thermal slowdown), and compare its "
        "step times with a cooler run before reading a regression into them."
    ),
}


def diagnose_gpu(gpu: GpuUtil, th: Thresholds) -> list[Diagnosis]:
    """GPU diagnoses that apply (none for a run without NVML samples, or too few)."""
    if gpu.samples < th.min_gpu_samples or gpu.util_mean_pct is None:
        return []
    found: list[Diagnosis] = []
    if gpu.util_mean_pct < th.low_gpu_util_pct:
        found.append(
            Diagnosis(
                "gpu",
                LOW_GPU_UTILIZATION,
                Severity.WARN,
                f"The GPU was busy {gpu.util_mean_pct:.0f}% of the time on average over "
                f"{gpu.samples} samples (threshold {th.low_gpu_util_pct:g}%).",
                GPU_NEXT_STEP[LOW_GPU_UTILIZATION],
            )
        )
    hot = gpu.temp_max_c
    limit = th.high_gpu_temp_c
    if gpu.temp_slowdown_c is not None:
        limit = min(limit, gpu.temp_slowdown_c - th.gpu_temp_margin_c)
    if hot is not None and hot >= limit:
        slowdown = (
            f"; the device slows its clocks at {gpu.temp_slowdown_c:.0f} C"
            if gpu.temp_slowdown_c is not None
            else ""
        )
        found.append(
            Diagnosis(
                "gpu",
                HIGH_GPU_TEMPERATURE,
                Severity.WARN,
                f"The GPU reached {hot:.0f} C (threshold {limit:g} C{slowdown}).",
                GPU_NEXT_STEP[HIGH_GPU_TEMPERATURE],
            )
        )
    return found
