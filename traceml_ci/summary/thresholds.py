"""Named, documented thresholds of every diagnosis (docs/diagnoses.md explains each one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    """Defaults are chosen with wide margins so that a job far from a boundary gets the same label
    on every run; override any field with ``traceml.init(thresholds=Thresholds(...))``."""

    # --- step time (percent of step time) ---
    #: Fewer analysed steps than this -> INSUFFICIENT_DATA.
    min_steps: int = 10
    #: dataloader_pct at or above this -> INPUT_BOUND.
    input_bound_pct: float = 30.0
    #: h2d_pct (host-to-device copies inside the step) at or above this -> H2D_BOUND. Lower
    #: than the other phases' 30: a copy is work the device does not need at all once the
    #: batch is pinned and copied ``non_blocking`` ahead of its use (or kept on the device),
    #: and a pinned copy runs at ~10-25 GB/s, so a fifth of a step spent copying means a
    #: pageable batch, a batch far larger than the model's work on it, or copies made one
    #: small tensor at a time.
    h2d_bound_pct: float = 20.0
    #: optimizer_pct at or above this -> OPTIMIZER_BOUND.
    optimizer_bound_pct: float = 30.0
    #: other_pct (time outside the named phases) at or above this -> OVERHEAD_BOUND.
    overhead_bound_pct: float = 30.0
    #: forward_pct + backward_pct at or above this -> COMPUTE_BOUND.
    compute_bound_pct: float = 60.0
    #: A share at or above this is "critical" rather than a warning.
    critical_pct: float = 50.0
    #: Steps outside Tukey fences with this k are outliers, left out of the percentages.
    outlier_fence_k: float = 3.0
    #: Noise windows: aim for this many windows of at least ``noise_min_window`` steps.
    noise_windows: int = 10
    noise_min_window: int = 5

    # --- memory ---
    #: Fewer memory samples than this -> NO_DATA.
    min_memory_samples: int = 3
    #: Growth over the analysed steps at least this many MB ...
    growth_min_mb: float = 64.0
    #: ... and at least this fraction of the starting level -> MEMORY_GROWTH.
    growth_min_fraction: float = 0.10
    #: Peak reserved (GPU) or RSS (CPU) at or above this fraction of the total -> HIGH_PRESSURE.
    high_pressure_fraction: float = 0.90
    #: Peak reserved at or above this multiple of peak allocated ...
    fragmentation_ratio: float = 1.5
    #: ... with at least this many MB unused in the cache -> FRAGMENTATION.
    fragmentation_min_mb: float = 1024.0

    # --- GPU (the NVML sampler's figures: tracer/gpu_util.py) ---
    #: Fewer NVML samples than this (5 a second) -> no GPU diagnosis: a run of under ~2 s is
    #: mostly start-up (allocator warm-up, cuDNN autotuning, the first compiled graphs).
    min_gpu_samples: int = 10
    #: Mean utilisation below this -> LOW_GPU_UTILIZATION. NVML's utilisation is the share of
    #: each sample period in which any kernel ran: a loop that keeps its GPU fed sits at 90 %+
    #: even with small kernels, so under 40 % the GPU stood idle most of the run -- waiting
    #: for input, copies, the host or other ranks. Far below the healthy range, so the label
    #: does not flicker between runs.
    low_gpu_util_pct: float = 40.0
    #: Highest core temperature at or above this (degrees C) -> HIGH_GPU_TEMPERATURE. NVIDIA's
    #: data-centre GPUs begin to slow their clocks (thermal slowdown) at about 85-95 degrees C
    #: depending on the model; 85 warns before any of them throttles. Where the device reports
    #: its own slowdown threshold, reaching within ``gpu_temp_margin_c`` of it fires too.
    high_gpu_temp_c: float = 85.0
    gpu_temp_margin_c: float = 5.0

    # --- ranks (a merged distributed summary) ---
    #: The ranks' peak GPU memory (allocated) differs by at least this fraction of the highest
    #: peak ... Data-parallel ranks hold the same model, optimizer state and batch shapes, so
    #: their peaks agree within a few percent; rank 0 may hold a little more (metrics, a
    #: checkpoint gathered to it).
    rank_memory_imbalance_fraction: float = 0.20
    #: ... and by at least this many MB -> RANK_GPU_MEMORY_IMBALANCE (a small model's peaks
    #: differ by large fractions of little).
    rank_memory_imbalance_min_mb: float = 1024.0


DEFAULT_THRESHOLDS = Thresholds()
