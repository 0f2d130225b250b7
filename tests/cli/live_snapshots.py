"""Live snapshots for the view's and watch's tests, made the way the tracer makes them: a
summary from ``build_summary`` over real step numbers, through ``snapshot_from_summary``.

Run as a module it is a job's snapshot writer (``python -m tests.cli.live_snapshots OUT STOP``):
it rewrites ``OUT/live/rank0.json`` with a growing step count every 0.1 s until the file STOP
exists, then writes the final snapshot (status completed, the summary's path) and exits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from tests.summary.builders import summary_doc
from traceml_ci.fsutil import atomic_write_text
from traceml_ci.summary.diagnose import diagnose_memory
from traceml_ci.summary.live import snapshot_from_summary, snapshot_path
from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS

#: Phase ms per step that the summary's own rules label as named.
SPLITS: dict[str, dict[str, Any]] = {
    "INPUT_BOUND": {"phase_ms": {"dataloader": 4.7, "forward": 3.1, "backward": 1.8,
                                 "optimizer": 0.4}},
    "COMPUTE_BOUND": {"phase_ms": {"dataloader": 0.3, "forward": 4.0, "backward": 6.0,
                                   "optimizer": 0.5}},
    "OPTIMIZER_BOUND": {"phase_ms": {"dataloader": 0.3, "forward": 2.0, "backward": 3.0,
                                     "optimizer": 4.0}},
    "OVERHEAD_BOUND": {"phase_ms": {"dataloader": 0.3, "forward": 2.0, "backward": 2.5,
                                    "optimizer": 0.5}, "other_ms": 4.0},
    "BALANCED": {"phase_ms": {"dataloader": 2.0, "forward": 2.5, "backward": 2.5,
                              "optimizer": 1.5}, "other_ms": 1.5},
}
#: Where the split stood in the first window (to show a move since the start).
FIRST_PCT = {"dataloader": 31.0, "forward": 30.0, "backward": 25.0, "optimizer": 6.0,
             "other": 8.0}
#: The CPU memory block of a snapshot.
CPU_MEMORY = {"rss_mb": 311.2, "allocated_mb": None, "reserved_mb": None,
              "growth_mb_per_1k_steps": 0.1, "growth_basis": "rss"}


def history(n: int = 60, base: float = 10.0) -> list[float]:
    """A deterministic step-time history with a slow rise and a wobble, ``n`` points."""
    return [round(base + 0.02 * i + (0.3 if i % 5 == 0 else 0.0), 3) for i in range(n)]


def growth_diagnosis() -> dict[str, Any]:
    """The memory diagnosis the summary's rules give to 600 MB of growth from 2 GB."""
    d = diagnose_memory(samples=40, growth_mb=600.0, start_mb=2048.0, basis="allocated",
                        peak_mb=2648.0, total_mb=81920.0, peak_allocated_mb=2648.0,
                        peak_reserved_mb=2900.0, ooms=None, th=DEFAULT_THRESHOLDS)[0]
    return {"kind": d.kind, "message": d.message, "next_step": d.next_step}


def steady_diagnosis() -> dict[str, Any]:
    """The memory diagnosis the summary's rules give to flat memory (the window's summary has
    no memory samples of its own)."""
    d = diagnose_memory(samples=40, growth_mb=0.5, start_mb=311.0, basis="rss", peak_mb=311.5,
                        total_mb=None, peak_allocated_mb=None, peak_reserved_mb=None, ooms=None,
                        th=DEFAULT_THRESHOLDS)[0]
    return {"kind": d.kind, "message": d.message, "next_step": d.next_step}


def snapshot(label: str = "INPUT_BOUND", *, heartbeat: float = 1_000.0, steps_done: int = 1200,
             steps_per_s: float | None = 14.2, rank: int = 0, world_size: int = 1,
             host: str = "ci-runner-7", pid: int = 4242, run_name: str = "train_resnet",
             status: str = "running", summary_path: str | None = None,
             memory: dict[str, Any] | None = None,
             first_window_pct: dict[str, float] | None = FIRST_PCT,
             history_ms: list[float] | None = None) -> dict[str, Any]:
    """A snapshot of a job whose window the summary labels ``label`` (a key of SPLITS)."""
    split = SPLITS[label]
    window = summary_doc(split["phase_ms"], other_ms=split.get("other_ms", 0.0), steps=100,
                         jitter=0.02)
    identity = {"run_name": run_name, "rank": rank, "local_rank": rank, "world_size": world_size,
                "host": host, "pid": pid,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(heartbeat - 85.0))}
    median = window["step_time"]["step_ms"]["median"]
    snap = snapshot_from_summary(
        window, steps_done=steps_done, steps_per_s=steps_per_s,
        history_ms=history(base=median - 0.8) if history_ms is None else history_ms,
        first_window_pct=first_window_pct, memory=dict(CPU_MEMORY if memory is None else memory),
        identity=identity, status=status, heartbeat=heartbeat, summary_path=summary_path)
    snap["memory_diagnosis"] = steady_diagnosis()
    return snap


def rank_snapshot(phase_ms: dict[str, float], rank: int, world_size: int = 2,
                  **kw: Any) -> dict[str, Any]:
    """A rank's snapshot whose window splits into ``phase_ms``, with the wait phase (a run
    under a process group; ``phase_ms["wait"]``: its ms per step waiting in collectives)."""
    window = summary_doc(phase_ms, steps=100, jitter=0.02, waits=True)
    window["run"]["rank"] = rank
    identity = {"run_name": "train_ddp", "rank": rank, "local_rank": rank,
                "world_size": world_size, "host": "node-a", "pid": 4242 + rank,
                "started_at": "2026-11-29T00:00:00Z"}
    snap = snapshot_from_summary(
        window, steps_done=kw.pop("steps_done", 1200), steps_per_s=14.2, history_ms=history(),
        first_window_pct=kw.pop("first_window_pct", None), memory=dict(CPU_MEMORY),
        identity=identity, heartbeat=kw.pop("heartbeat", 1_000.0), **kw)
    snap["memory_diagnosis"] = steady_diagnosis()
    return snap


def write(out_dir: str | os.PathLike[str], snap: dict[str, Any]) -> None:
    """Write ``snap`` where the tracer would, atomically."""
    atomic_write_text(snapshot_path(out_dir, snap["rank"]), json.dumps(snap))


def main(out_dir: str, stop: str) -> None:
    steps = 0
    while not os.path.exists(stop):
        steps += 10
        write(out_dir, snapshot(heartbeat=time.time(), steps_done=steps, pid=os.getpid()))
        time.sleep(0.1)
    summary = os.path.join(out_dir, "final_summary.json")
    write(out_dir, snapshot(heartbeat=time.time(), steps_done=steps + 10, pid=os.getpid(),
                            status="completed", summary_path=summary))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
