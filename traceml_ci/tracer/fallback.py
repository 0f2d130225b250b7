"""The summary the launcher writes when the traced process left none (it died, or never imported
torch): torch-free, so ``traceml-ci run`` never imports torch itself.

A process killed mid-run (SIGKILL, the OOM killer) leaves its last live snapshot: its window
summary -- the newest steps' statistics, the run's step count -- becomes the summary, marked
``run.recovered_from: "live_snapshot"``, rather than a summary of no steps."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from traceml_ci.summary.build import RunRecord, StepSeries, build_summary
from traceml_ci.summary.io import write_summary
from traceml_ci.summary.model import RunInfo, RunStatus


def _torch_version() -> str | None:
    try:
        return metadata.version("torch")  # without importing torch: it costs seconds
    except metadata.PackageNotFoundError:
        return None


#: ``run.recovered_from`` of a summary made from the last live snapshot.
RECOVERED_FROM_SNAPSHOT = "live_snapshot"


def last_snapshot(out_dir: Path, pid: int, started: float) -> dict[str, Any] | None:
    """The newest live snapshot process ``pid`` wrote under ``out_dir`` during this run (its
    heartbeat after ``started``, wall-clock seconds), with its window summary; else None."""
    from traceml_ci.summary.live import read_snapshots

    for snap in read_snapshots(out_dir):
        beat = snap.get("heartbeat")
        if (snap.get("pid") == pid and isinstance(beat, (int, float)) and beat >= started
                and isinstance(snap.get("window_summary"), Mapping)
                and (snap.get("steps_done") or 0) > 0):
            return snap
    return None


def _env() -> dict[str, Any]:
    """What the launcher can tell of the child's environment without importing torch."""
    return {
        "python": platform.python_version(),
        "torch": _torch_version(),
        "cuda": None,
        "device_type": "unknown",
        "device_name": None,
        "gpu_count": 0,
        "cpu_count": os.cpu_count(),
        "torch_threads": None,
        "platform": f"{sys.platform}-{platform.machine()}",
    }


def _from_snapshot(snap: Mapping[str, Any], started: float, status: RunStatus) -> dict[str, Any]:
    doc = json.loads(json.dumps(snap["window_summary"]))  # a deep copy of plain JSON
    run = doc.setdefault("run", {})
    run["status"] = status.value
    beat = float(snap["heartbeat"])
    run["duration_s"] = round(max(0.0, beat - started), 3)
    run["recovered_from"] = RECOVERED_FROM_SNAPSHOT
    doc["env"] = {**_env(), **(doc.get("env") or {})}  # a window records no environment
    return doc


def write_fallback_summary(
    path: Path,
    run_name: str,
    started: float,
    status: RunStatus,
    mode: str = "auto",
    snapshot: Mapping[str, Any] | None = None,
) -> Path:
    """The summary of a run that wrote none: from ``snapshot`` (``last_snapshot``) when there
    is one, else a summary with no steps; ``run.status`` set either way. ``started``:
    wall-clock seconds."""
    if snapshot is not None:
        try:
            return write_summary(path, _from_snapshot(snapshot, started, status))
        except (KeyError, TypeError, ValueError):  # a snapshot not as we wrote it: no steps
            pass
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
        env=_env(),
        clock="host",
        steps_total=0,
        warmup_steps=0,
        series=StepSeries(
            step_ms=[], phase_ms={"dataloader": [], "forward": [], "backward": [], "optimizer": []}
        ),
    )
    return write_summary(path, build_summary(record))
