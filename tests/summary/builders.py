"""Build RunRecords and summaries from plain numbers, for summary-layer tests."""

from __future__ import annotations

from typing import Any

from traceml_ci.summary.build import RunRecord, StepSeries, build_summary
from traceml_ci.summary.model import RunInfo, RunStatus
from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS, Thresholds

ENV = {
    "python": "3.11.7",
    "torch": "2.13.0",
    "cuda": None,
    "device_type": "cpu",
    "device_name": "x86_64",
    "gpu_count": 0,
    "cpu_count": 2,
    "torch_threads": 1,
    "platform": "linux-x86_64",
}


def record(
    phase_ms: dict[str, float],
    *,
    steps: int = 50,
    other_ms: float = 0.0,
    jitter: float = 0.0,
    **overrides: Any,
) -> RunRecord:
    """``steps`` identical steps (optionally with a deterministic +-jitter) of the given phases."""
    measured = ("dataloader", "forward", "backward", "optimizer")
    cols: dict[str, list[float]] = {
        p: [] for p in (*measured, "wait", "h2d") if p in measured or p in phase_ms
    }
    step_ms: list[float] = []
    for i in range(steps):
        wobble = 1.0 + (jitter if i % 2 else -jitter)
        row = {p: phase_ms.get(p, 0.0) * wobble for p in cols}
        for p, v in row.items():
            cols[p].append(v)
        step_ms.append(sum(row.values()) + other_ms)
    fields: dict[str, Any] = dict(
        run=RunInfo("t", RunStatus.COMPLETED, "2026-11-29T00:00:00Z", 1.0, "auto"),
        env=dict(ENV),
        clock="host",
        steps_total=steps + 5,
        warmup_steps=5,
        series=StepSeries(step_ms=step_ms, phase_ms=cols),
    )
    fields.update(overrides)
    return RunRecord(**fields)


def summary_doc(phase_ms: dict[str, float], th: Thresholds = DEFAULT_THRESHOLDS, **kw: Any) -> dict:
    return build_summary(record(phase_ms, **kw), th).to_dict()
