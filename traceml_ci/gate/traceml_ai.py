"""Map TraceML's own final_summary.json (traceml-ai 0.5, schema_version 1.x) to ours.

What has no counterpart is listed in the mapped summary's ``mapped_from.unmapped``, and the
gate reports it. Labels are re-derived from the mapped shares with traceml-ci's thresholds, so a
traceml-ai base and a traceml-ci head are judged by one rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceml_ci.errors import InputError
from traceml_ci.summary.keys import PHASES
from traceml_ci.summary.view import finite

TOOL = "traceml-ai"
#: The major schema version of traceml-ai summaries this mapping reads.
SUPPORTED_MAJOR = 1
MIB = 1024.0 * 1024.0

#: traceml-ai memory kinds with a traceml-ci equivalent.
MEMORY_KINDS = {
    "NO_GPU": "NO_DATA",
    "NO_DATA": "NO_DATA",
    "NORMAL": "BALANCED",
    "BALANCED": "BALANCED",
    "MEMORY_GROWTH": "MEMORY_GROWTH",
    "MEMORY_CREEP": "MEMORY_GROWTH",
    "HIGH_PRESSURE": "HIGH_PRESSURE",
    "FRAGMENTATION": "FRAGMENTATION",
}
RUN_STATUSES = {"completed": "completed", "crashed": "crashed", "failed": "crashed",
                "interrupted": "interrupted", "killed": "interrupted"}


def is_traceml_ai(doc: Mapping[str, Any]) -> bool:
    """traceml-ai writes schema_version as a JSON number, with sections traceml-ci never has
    (``primary_diagnosis``, ``analysis_window``, ``step_time.global``)."""
    version = doc.get("schema_version")
    numeric = isinstance(version, (int, float)) and not isinstance(version, bool)
    st = doc.get("step_time")
    markers = ("primary_diagnosis" in doc or "analysis_window" in doc
               or (isinstance(st, Mapping) and "global" in st))
    return numeric and markers


def _get(node: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _stat(section: Any, metric: str) -> float | None:
    """A metric of a traceml-ai section's global view: the median, else the average."""
    median = finite(_get(section, "global", "median", metric, "value"))
    return median if median is not None else finite(_get(section, "global", "average", metric))


def _worst(section: Any, metric: str) -> float | None:
    return finite(_get(section, "global", "worst", metric, "value"))


def _mb(x: float | None) -> float | None:
    return None if x is None else round(x / MIB, 2)


def map_summary(doc: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """Our summary dict for a traceml-ai one; raises InputError when it has no step times."""
    from traceml_ci.summary.diagnose import diagnose_step_time
    from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS

    version = doc.get("schema_version")
    if isinstance(version, (int, float)) and int(version) > SUPPORTED_MAJOR:
        raise InputError(path, f"traceml-ai schema_version {version} is newer than this "
                         f"traceml-ci maps ({SUPPORTED_MAJOR}.x); upgrade traceml-ci")
    unmapped: list[str] = []
    notes: list[str] = []
    st = doc.get("step_time")
    step = _stat(st, "step_time_ms")
    if step is None or step <= 0:
        raise InputError(path, "traceml-ai summary has no step_time figures to map")
    parts = {
        "dataloader": _stat(st, "input_wait_ms"),
        "forward": _stat(st, "forward_ms"),
        "backward": _stat(st, "backward_ms"),
        "optimizer": _stat(st, "optimizer_ms"),
    }
    if parts["dataloader"] is None:
        parts["dataloader"] = _stat(st, "dataloader_fetch_cpu_ms")
    for phase, ms in parts.items():
        if ms is None:
            unmapped.append(f"step_time.phase_ms.{phase}")
    known = {k: max(v or 0.0, 0.0) for k, v in parts.items()}
    total = sum(known.values())
    scale = step / total if total > step else 1.0  # medians of parts can exceed the median step
    phase_ms = {k: v * scale for k, v in known.items()}
    phase_ms["other"] = max(step - sum(phase_ms.values()), 0.0)
    pct = {k: round(v / step * 100.0, 2) for k, v in phase_ms.items()}
    pct["other"] = round(max(100.0 - sum(pct[k] for k in PHASES if k != "other"), 0.0), 2)

    window = _get(st, "global", "window") or {}
    analyzed = window.get("steps_analyzed") if isinstance(window, Mapping) else None
    analyzed = int(analyzed) if isinstance(analyzed, int) and analyzed >= 0 else 0
    total_steps = _get(st, "metadata", "training_total_steps")
    total_steps = total_steps if isinstance(total_steps, int) and total_steps >= 0 else analyzed
    label = diagnose_step_time(pct, analyzed, 0, DEFAULT_THRESHOLDS)[0].kind
    their_label = _get(st, "diagnosis", "kind")
    if isinstance(their_label, str) and their_label != label:
        notes.append(f"step_time.diagnosis re-derived as {label} (traceml-ai said {their_label})")
    clock = _get(st, "global", "window", "diagnosis_clock")

    mem = doc.get("step_memory")
    their_mem = _get(mem, "diagnosis", "kind")
    mem_label = MEMORY_KINDS.get(their_mem) if isinstance(their_mem, str) else None
    if mem_label is None:
        unmapped.append(f"step_memory.diagnosis ({their_mem})")
        mem_label = "NO_DATA"
    rss = _worst(doc.get("process"), "ram_bytes")
    if rss is None:
        unmapped.append("step_memory.peak_rss_mb")
    gpus = _get(doc, "meta", "gpus_observed")
    gpus = gpus if isinstance(gpus, int) and gpus >= 0 else 0
    device = "cuda" if gpus else "cpu"
    unmapped += ["step_time.noise", "step_ms p10/p90", "env (python, torch, platform)",
                 "throughput.samples_per_s"]

    run_status = _get(doc, "run_context", "run", "status")
    duration = finite(doc.get("duration_s"))
    generated = doc.get("generated_at")
    return {
        "schema_version": "1.0",
        "tool": {"name": TOOL, "version": f"schema {version}"},
        "run": {
            "name": str(_get(doc, "meta", "run_name") or ""),
            "status": RUN_STATUSES.get(str(run_status), "completed"),
            "started_at": generated if isinstance(generated, str) else "",
            "duration_s": max(duration or 0.0, 0.0),
        },
        "env": {
            "python": "unknown", "torch": None, "cuda": None, "device_type": device,
            "device_name": None, "gpu_count": gpus, "cpu_count": None, "torch_threads": None,
            "platform": "unknown",
        },
        "step_time": {
            "diagnosis": label,
            **{f"{k}_pct": pct[k] for k in PHASES},
            "steps_total": total_steps,
            "steps_analyzed": analyzed,
            "warmup_steps": 0,
            "outlier_steps": 0,
            "step_ms": {"median": round(step, 4), "p10": None, "p90": None,
                        "mean": finite(_get(st, "global", "average", "step_time_ms"))},
            "phase_ms": {k: round(v, 4) for k, v in phase_ms.items()},
            "throughput": {"steps_per_s": round(1000.0 / step, 3), "samples_per_s": None,
                           "batch_size": None},
            "clock": "host" if clock in (None, "cpu") else "device_event",
            "noise": None,
        },
        "step_memory": {
            "diagnosis": mem_label,
            "device": device,
            "peak_allocated_mb": _mb(_worst(mem, "peak_allocated_bytes")),
            "peak_reserved_mb": _mb(_worst(mem, "peak_reserved_bytes")),
            "peak_rss_mb": _mb(rss),
            "growth_mb_per_1k_steps": None,
        },
        "diagnoses": [],
        "mapped_from": {"tool": TOOL, "schema_version": str(version), "unmapped": unmapped,
                        "notes": notes},
    }
