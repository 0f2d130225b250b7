"""The live snapshot: what a running job says about its recent steps, for the live view.

A traced process (each rank) keeps one small JSON file, ``<out>/live/rank<N>.json``, rewritten
atomically about twice a second by a background thread of the tracer (never the per-step
path), and a last time when the run ends. ``traceml-ci run`` and ``traceml-ci watch`` read
those files; nothing else does. The format is versioned (``LIVE_VERSION``) and documented in
docs/live.md. The window's shares, diagnosis and hint come from ``build_summary`` over the
window's steps: the same code and thresholds as ``final_summary.json``.

Pure data, standard library only: the launcher reads snapshots without torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from traceml_ci.summary.view import SummaryView, finite, whole

#: The snapshot format's version; readers skip files of another major version.
LIVE_VERSION = "1.0"
#: Folder under the run's output folder that holds the snapshots.
LIVE_DIRNAME = "live"
#: The analysed steps a snapshot's window covers (the most recent ones).
WINDOW_STEPS = 100
#: Step-time medians kept for the sparkline (one per snapshot).
HISTORY_POINTS = 60
#: Seconds between snapshots while a job runs.
SNAPSHOT_INTERVAL_S = 0.5
#: A running rank whose heartbeat is older than this (seconds) is stale: stopped, hung, or gone.
STALE_AFTER_S = 10.0
#: Snapshots are a few KB; a bigger file in the folder is not one (and is not read).
MAX_SNAPSHOT_BYTES = 256 * 1024

#: ``status`` values: still running, or how the run ended.
RUNNING = "running"
ENDED = ("completed", "crashed", "interrupted")


def live_dir(out_dir: str | os.PathLike[str]) -> Path:
    return Path(out_dir) / LIVE_DIRNAME


def snapshot_path(out_dir: str | os.PathLike[str], rank: int) -> Path:
    return live_dir(out_dir) / f"rank{int(rank)}.json"


def snapshot_from_summary(
    window: Mapping[str, Any],
    *,
    steps_done: int,
    steps_per_s: float | None,
    history_ms: Sequence[float],
    first_window_pct: Mapping[str, float | None] | None,
    memory: Mapping[str, Any],
    identity: Mapping[str, Any],
    status: str = RUNNING,
    heartbeat: float,
    summary_path: str | None = None,
    max_steps: int | None = None,
    last_step_at: float | None = None,
) -> dict[str, Any]:
    """A snapshot from the summary dict ``build_summary`` made of the window's steps.

    ``identity``: rank, local_rank, world_size, host, pid, run name, started_at (the tracer's);
    ``memory``: rss_mb (now), allocated_mb and reserved_mb (the newest step's device peaks),
    growth_mb_per_1k_steps and growth_basis ("allocated" | "rss" | None: the final summary's
    ``step_memory`` fields over the run so far), as known;
    ``first_window_pct``: the shares of the first window after warmup (to show how the split
    moved since the start); ``max_steps``: the tracer's cap on recorded steps (None: none):
    once ``steps_done`` reaches it the job goes on untraced, and ``steps_per_s`` is None;
    ``last_step_at``: when (``time.time()``, to a snapshot interval) ``steps_done`` last grew --
    a heartbeat that goes on while steps do not says the job is alive but stuck or idle."""
    st = window.get("step_time") or {}
    step_ms = st.get("step_ms") or {}
    # The window's own phases: ``wait`` only where the run used a process group.
    phases = SummaryView(window).phases
    diagnoses = [d for d in window.get("diagnoses") or [] if isinstance(d, Mapping)]

    def first(area: str) -> dict[str, Any]:
        d = next((d for d in diagnoses if d.get("area") == area), None)
        if d is None:
            return {"kind": None, "severity": None, "message": None, "next_step": None}
        return {k: d.get(k) for k in ("kind", "severity", "message", "next_step")}

    return {
        "live_version": LIVE_VERSION,
        **{k: identity.get(k) for k in ("run_name", "rank", "local_rank", "world_size", "host",
                                        "pid", "started_at")},
        "status": status,
        "heartbeat": heartbeat,
        "steps_done": int(steps_done),
        "steps_per_s": finite(steps_per_s),
        "window": {
            "steps": st.get("steps_analyzed", 0),
            "pct": {p: finite(st.get(f"{p}_pct")) for p in phases},
            "phase_ms": {p: finite((st.get("phase_ms") or {}).get(p)) for p in phases},
            "step_ms": {"median": finite(step_ms.get("median")), "p90": finite(step_ms.get("p90"))},
            "clock": st.get("clock"),
        },
        "first_window_pct": ({p: finite(first_window_pct.get(p)) for p in phases}
                             if first_window_pct else None),
        "history_ms": [round(float(v), 3) for v in history_ms[-HISTORY_POINTS:]],
        "memory": dict(memory),
        "gpu_util_pct": finite((window.get("gpu") or {}).get("util_mean_pct")),
        "diagnosis": first("step_time"),
        "memory_diagnosis": first("step_memory"),
        "summary_path": summary_path,
        "max_steps": max_steps,
        "last_step_at": finite(last_step_at),
        # The window's whole summary: what the launcher writes if the process is killed
        # before it writes its own (``tracer/fallback.py``).
        "window_summary": dict(window),
    }


def read_snapshot(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """One snapshot, or None when the file is missing, torn, too big, not JSON, or of another
    major version: a reader never fails on what a writer left half-done."""
    from traceml_ci.errors import InputError
    from traceml_ci.fsutil import read_text

    try:  # a regular file only: a FIFO or device in the folder is skipped, never waited on
        doc = json.loads(read_text(path, MAX_SNAPSHOT_BYTES))
    except (InputError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    version = doc.get("live_version")
    if not isinstance(version, str) or version.split(".")[0] != LIVE_VERSION.split(".")[0]:
        return None
    return doc


def read_snapshots(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every readable snapshot under ``out_dir``'s live folder, ordered by rank."""
    folder = live_dir(out_dir)
    try:
        names = sorted(p for p in folder.iterdir() if p.name.startswith("rank")
                       and p.suffix == ".json")
    except OSError:
        return []
    docs = [d for d in (read_snapshot(p) for p in names) if d is not None]

    def rank(doc: Mapping[str, Any]) -> int:
        r = whole(doc.get("rank"))
        return r if r is not None else 1 << 30

    return sorted(docs, key=rank)


def is_stale(snapshot: Mapping[str, Any], now: float, after_s: float = STALE_AFTER_S) -> bool:
    """A running snapshot whose heartbeat is older than ``after_s`` seconds."""
    if snapshot.get("status") != RUNNING:
        return False
    beat = finite(snapshot.get("heartbeat"))
    return beat is None or now - beat > after_s
