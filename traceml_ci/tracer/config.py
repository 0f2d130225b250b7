"""Tracer settings, from init() keywords, the environment and `traceml-ci run` flags."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from traceml_ci.summary.keys import (  # noqa: F401  (re-exported for the tracer's modules)
    DEFAULT_OUT_DIR,
    DEFAULT_WARMUP_STEPS,
    ENV_OUT,
    SUMMARY_FILENAME,
)
from traceml_ci.summary.live import ENV_LIVE, live_from_env
from traceml_ci.summary.profile import ENV_PROFILE_STEPS, profile_steps_from_env
from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS, Thresholds

MODES = ("auto", "manual")


@dataclass
class TracerConfig:
    mode: str = "auto"
    out_dir: Path = field(default_factory=lambda: Path(os.environ.get(ENV_OUT) or DEFAULT_OUT_DIR))
    run_name: str | None = None
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    batch_size: int | None = None
    #: Record at most this many steps (warmup included); later steps run untraced.
    max_steps: int | None = None
    thresholds: Thresholds = DEFAULT_THRESHOLDS
    #: Keep ``<out>/live/rank<N>.json`` up to date while the run goes (the live view reads it).
    live: bool = field(default_factory=lambda: live_from_env(os.environ.get(ENV_LIVE)))
    #: Profile this many steps after the warmup under torch.profiler (0: off; the pytest
    #: plugin's escalation on a regression). ``<out>/profile/``: trace.json, top_ops.json.
    profile_steps: int = field(
        default_factory=lambda: profile_steps_from_env(os.environ.get(ENV_PROFILE_STEPS)))
    #: Fields a launcher fixed (e.g. `traceml-ci run --out`); a later init() leaves them alone.
    locked: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if int(self.warmup_steps) < 0:
            raise ValueError("warmup_steps must be >= 0")
        if self.max_steps is not None and int(self.max_steps) < 1:
            raise ValueError("max_steps must be >= 1")
        if int(self.profile_steps) < 0:
            raise ValueError("profile_steps must be >= 0")
        self.out_dir = Path(self.out_dir)
        self.profile_steps = int(self.profile_steps)
        self.warmup_steps = int(self.warmup_steps)

    @property
    def summary_path(self) -> Path:
        rank = int(os.environ.get("RANK", "0") or 0)
        name = SUMMARY_FILENAME if rank == 0 else f"final_summary.rank{rank}.json"
        return self.out_dir / name
