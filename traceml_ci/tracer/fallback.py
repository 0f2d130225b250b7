"""The summary the launcher writes when the traced process left none (it died, or never imported
torch): torch-free, so ``traceml-ci run`` never imports torch itself."""

from __future__ import annotations

import os
import platform
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from traceml_ci.summary.build import RunRecord, StepSeries, build_summary
from traceml_ci.summary.io import write_summary
from traceml_ci.summary.model import RunInfo, RunStatus


def _torch_version() -> str | None:
    try:
        return metadata.version("torch")  # without importing torch: it costs seconds
    except metadata.PackageNotFoundError:
        return None


def write_fallback_summary(
    path: Path, run_name: str, started: float, status: RunStatus, mode: str = "auto"
) -> Path:
    """A summary with no steps and ``run.status`` set; ``started``: wall-clock seconds."""
    record = RunRecord(
        run=RunInfo(
            name=run_name,
            status=status,
            started_at=datetime.fromtimestamp(started, timezone.utc)
            .isoformat(timespec="seconds")
            .replace("+00:00", "Z"),
            duration_s=max(0.0, time.time() - started),
            mode=mode,
        ),
        env={
            "python": platform.python_version(),
            "torch": _torch_version(),
            "cuda": None,
            "device_type": "unknown",
            "device_name": None,
            "gpu_count": 0,
            "cpu_count": os.cpu_count(),
            "torch_threads": None,
            "platform": f"{sys.platform}-{platform.machine()}",
        },
        clock="host",
        steps_total=0,
        warmup_steps=0,
        series=StepSeries(
            step_ms=[], phase_ms={"dataloader": [], "forward": [], "backward": [], "optimizer": []}
        ),
    )
    return write_summary(path, build_summary(record))
