"""Map TraceML's own final_summary.json (traceml-ai 0.5, schema_version 1.x) to ours.

Read as strictly as our own: every field the mapping reads is checked first against
``schemas/traceml_ai_summary.schema.json`` (its type, its range, its vocabulary), so a wrong
value is one line naming it (exit 2), never dropped; a newer major (TraceML 0.5.1's schema 2.0)
is refused in one line. What
has no counterpart, or was filled in from something else, is listed in the mapped summary's
``mapped_from`` (``unmapped``, ``notes``), and the gate reports both. Labels are re-derived from
the mapped shares with traceml-ci's thresholds, so a traceml-ai base and a traceml-ci head are
judged by one rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from traceml_ci.errors import InputError
from traceml_ci.summary.keys import PHASES
from traceml_ci.summary.view import finite

TOOL = "traceml-ai"
#: The major schema version of traceml-ai summaries this mapping reads.
SUPPORTED_MAJOR = 1
MIB = 1024.0 * 1024.0

#: traceml-ai's step-memory diagnoses (0.5's, and the older names) -> ours; None: no
#: counterpart (said in the report as not mapped).
MEMORY_KINDS: dict[str, str | None] = {
    "NO_GPU": "NO_DATA",
    "NO_DATA": "NO_DATA",
    "NORMAL": "BALANCED",
    "BALANCED": "BALANCED",
    "MEMORY_GROWTH": "MEMORY_GROWTH",
    "MEMORY_CREEP": "MEMORY_GROWTH",
    "CREEP_CONFIRMED": "MEMORY_GROWTH",
    "CREEP_EARLY": None,  # rising, not yet confirmed: our growth rule has no "early"
    "IMBALANCE": None,  # across ranks: ours is a diagnosis of its own (summary/ranks.py)
    "HIGH_PRESSURE": "HIGH_PRESSURE",
    "FRAGMENTATION": "FRAGMENTATION",
}
#: traceml-ai's run statuses -> ours (a run still starting or running had not finished).
RUN_STATUSES = {"completed": "completed", "crashed": "crashed", "failed": "crashed",
                "interrupted": "interrupted", "killed": "interrupted",
                "starting": "interrupted", "running": "interrupted"}
#: The fields the mapping reads, their types, bounds and vocabularies (schemas/).
SCHEMA = "traceml_ai_summary.schema.json"

#: Sections that mark a document as traceml-ai's: traceml-ci never writes them.
MARKERS = ("primary_diagnosis", "analysis_window")


def is_traceml_ai(doc: Mapping[str, Any]) -> bool:
    """traceml-ai's summaries have sections traceml-ci never writes (``primary_diagnosis``,
    ``analysis_window``, ``step_time.global``), whatever their ``schema_version`` holds."""
    tool = doc.get("tool")
    if isinstance(tool, Mapping) and tool.get("name") == "traceml-ci":
        return False
    st = doc.get("step_time")
    return any(m in doc for m in MARKERS) or (isinstance(st, Mapping) and "global" in st)


def _version_problem(doc: Mapping[str, Any]) -> str | None:
    """What is wrong with a traceml-ai summary's ``schema_version`` (TraceML writes a JSON
    number, 1.9 for 0.5.0), or None: missing, not a number, a major this does not map."""
    if "schema_version" not in doc:
        return ("traceml-ai summary: $.schema_version: missing (TraceML writes a number such "
                "as 1.9)")
    version = doc["schema_version"]
    number = finite(version)
    if number is None and isinstance(version, str):
        try:
            number = float(version)
        except ValueError:
            number = None
        if number is not None and int(number) <= SUPPORTED_MAJOR:
            return (f"traceml-ai summary: $.schema_version: {json.dumps(version)} is a string "
                    "(TraceML writes a number such as 1.9)")
    if number is None:
        return (f"traceml-ai summary: $.schema_version: {json.dumps(version)[:40]} is not a "
                "version number (TraceML writes a number such as 1.9)")
    if int(number) > SUPPORTED_MAJOR:
        return (f"traceml-ai schema_version {version} is newer than this traceml-ci maps "
                f"({SUPPORTED_MAJOR}.x); upgrade traceml-ci")
    if int(number) < SUPPORTED_MAJOR:
        return (f"traceml-ai schema_version {version} is older than this traceml-ci maps "
                f"({SUPPORTED_MAJOR}.x)")
    return None


def problems(doc: Mapping[str, Any]) -> list[str]:
    """Every way ``doc`` is not a traceml-ai summary this mapping reads, one line each naming
    the field (``traceml-ai summary: $.step_time.diagnosis.kind: ...``); empty when it is. A
    schema version it does not map is the only line (a newer major may have changed anything)."""
    from traceml_ci.summary.schema import document_problems

    version = _version_problem(doc)
    if version:
        return [version]
    return [f"traceml-ai summary: {p}" for p in document_problems(doc, SCHEMA)]


def _get(node: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _median(section: Any, metric: str) -> float | None:
    return finite(_get(section, "global", "median", metric, "value"))


def _average(section: Any, metric: str) -> float | None:
    return finite(_get(section, "global", "average", metric))


def _worst(section: Any, metric: str) -> float | None:
    return finite(_get(section, "global", "worst", metric, "value"))


def _mb(x: float | None) -> float | None:
    return None if x is None else round(x / MIB, 2)


class _Mapping:
    """What one summary's mapping could not carry over (``unmapped``) and what it filled in
    from something else (``notes``), both reported by the gate."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc
        self.unmapped: list[str] = []
        self.notes: list[str] = []
        self.averaged: list[str] = []

    def stat(self, section: Any, metric: str) -> float | None:
        """A metric of a section's global view: the median, else the average (noted)."""
        median = _median(section, metric)
        if median is not None:
            return median
        average = _average(section, metric)
        if average is not None:
            self.averaged.append(metric)
        return average


def _phases(m: _Mapping, st: Any, step: float) -> tuple[dict[str, float], dict[str, float]]:
    """Each phase's ms and % of the step; a phase without its figure falls into other, and the
    rows it decides are said unmapped."""
    parts = {
        "dataloader": m.stat(st, "input_wait_ms"),
        "forward": m.stat(st, "forward_ms"),
        "backward": m.stat(st, "backward_ms"),
        "optimizer": m.stat(st, "optimizer_ms"),
    }
    if parts["dataloader"] is None:
        parts["dataloader"] = m.stat(st, "dataloader_fetch_cpu_ms")
    for phase, ms in parts.items():
        if ms is None:  # its time falls into other: neither share, nor the label they decide,
            # can be judged (gate/judging.py leaves the rows named here unjudged)
            m.unmapped += [f"step_time.phase_ms.{phase}", f"step_time.{phase}_pct"]
    if None in parts.values():
        m.unmapped += ["step_time.phase_ms.other", "step_time.other_pct", "step_time.diagnosis"]
    if m.averaged:
        m.notes.append("step_time: median missing, average used: " + ", ".join(m.averaged))
    known = {k: v or 0.0 for k, v in parts.items()}
    total = sum(known.values())
    scale = step / total if total > step else 1.0  # medians of parts can exceed the median step
    phase_ms = {k: v * scale for k, v in known.items()}
    phase_ms["other"] = max(step - sum(phase_ms.values()), 0.0)
    pct = {k: round(v / step * 100.0, 2) for k, v in phase_ms.items()}
    pct["other"] = round(max(100.0 - sum(pct[k] for k in PHASES if k != "other"), 0.0), 2)
    return phase_ms, pct


def _steps_and_label(m: _Mapping, st: Any, pct: dict[str, float]) -> tuple[int, int, str]:
    """(steps analysed, steps in all, our diagnosis of the shares: theirs, where it differs,
    is said in a note)."""
    from traceml_ci.summary.diagnose import diagnose_step_time
    from traceml_ci.summary.thresholds import DEFAULT_THRESHOLDS

    analyzed = _get(st, "global", "window", "steps_analyzed")
    analyzed = analyzed if isinstance(analyzed, int) else 0
    total_steps = _get(st, "metadata", "training_total_steps")
    total_steps = total_steps if isinstance(total_steps, int) else analyzed
    label = diagnose_step_time(pct, analyzed, 0, DEFAULT_THRESHOLDS)[0].kind
    their_label = _get(st, "diagnosis", "kind")
    if their_label is not None and their_label != label:
        m.notes.append(f"step_time.diagnosis re-derived as {label} "
                       f"(traceml-ai said {their_label})")
    return analyzed, total_steps, label


def _memory_label(m: _Mapping, mem: Any) -> str:
    """Their memory diagnosis as ours (NO_DATA, said unmapped, where it has no equivalent)."""
    their_mem = _get(mem, "diagnosis", "kind")
    mem_label = MEMORY_KINDS.get(their_mem) if their_mem is not None else None
    if mem_label is None:
        why = "missing" if their_mem is None else "no traceml-ci equivalent"
        m.unmapped.append(f"step_memory.diagnosis ({their_mem}: {why})" if their_mem
                          else f"step_memory.diagnosis ({why})")
        mem_label = "NO_DATA"
    return mem_label


def _run_status(m: _Mapping, doc: Mapping[str, Any]) -> str:
    """Their run's status as ours (a run not finished: interrupted, said in a note)."""
    run_status = _get(doc, "run_context", "run", "status")
    status = RUN_STATUSES.get(run_status, "completed") if run_status else "completed"
    if run_status in ("starting", "running"):
        m.notes.append(f"run_context.run.status {run_status} mapped as interrupted (the run had "
                       "not finished)")
    return status


def map_summary(doc: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """Our summary dict for a traceml-ai one; InputError(path, one line) when a field it reads
    is wrong (:func:`problems`) or it has no step times."""
    found = problems(doc)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise InputError(path, found[0] + more)
    version = doc["schema_version"]
    m = _Mapping(doc)
    st = doc.get("step_time")
    step = m.stat(st, "step_time_ms")
    if step is None or step <= 0:
        raise InputError(path, "traceml-ai summary has no step_time figures to map")
    phase_ms, pct = _phases(m, st, step)
    analyzed, total_steps, label = _steps_and_label(m, st, pct)
    clock = _get(st, "global", "window", "diagnosis_clock")
    mem = doc.get("step_memory")
    mem_label = _memory_label(m, mem)
    rss = _worst(doc.get("process"), "ram_bytes")
    if rss is None:
        m.unmapped.append("step_memory.peak_rss_mb")
    gpus = _get(doc, "meta", "gpus_observed")
    if gpus is None:
        m.unmapped.append("env.gpu_count (meta.gpus_observed missing: a CPU run assumed)")
        gpus = 0
    device = "cuda" if gpus else "cpu"
    mean = _average(st, "step_time_ms")
    if mean is None:
        m.unmapped.append("step_time.step_ms.mean")
    m.unmapped += ["step_time.noise", "step_ms p10/p90", "env (python, torch, platform)",
                   "throughput.samples_per_s"]
    status = _run_status(m, doc)
    duration = finite(doc.get("duration_s"))
    if duration is None:
        m.unmapped.append("run.duration_s")
    generated = doc.get("generated_at")
    if not generated:
        m.unmapped.append("run.started_at")
    return {
        "schema_version": "1.0",
        "tool": {"name": TOOL, "version": f"schema {version}"},
        "run": {
            "name": _get(doc, "meta", "run_name") or "",
            "status": status,
            "started_at": generated or "",
            "duration_s": duration or 0.0,
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
            "step_ms": {"median": round(step, 4), "p10": None, "p90": None, "mean": mean},
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
        "mapped_from": {"tool": TOOL, "schema_version": str(version), "unmapped": m.unmapped,
                        "notes": m.notes},
    }
