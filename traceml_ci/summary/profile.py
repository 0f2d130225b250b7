"""The top-ops document of a profiled run (``<out>/profile/top_ops.json``): read, write, compare.

Pure data, standard library only. The tracer writes it from ``torch.profiler``'s
``key_averages()`` after a few profiled steps (``tracer/profiling.py``); the pytest plugin reads
it, stores it in a baseline entry (``--traceml-profile``) and compares two of them
(``op_deltas``); the gate renders it (``gate/render/ops.py``). This module knows its key names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceml_ci.errors import InputError
from traceml_ci.summary.view import finite, whole

#: The document's version; a reader refuses another major version.
TOP_OPS_VERSION = "1.0"
#: ``kind`` field, so a stray JSON file is not taken for one.
TOP_OPS_KIND = "traceml-ci.top-ops"
#: Folder under a run's output folder that holds the profile, and its two files.
PROFILE_DIRNAME = "profile"
TRACE_FILENAME = "trace.json"  # chrome trace: Perfetto, chrome://tracing, HTA
TOP_OPS_FILENAME = "top_ops.json"
#: Ops kept per document (by self time): enough to see where a step went, small enough for a
#: PR comment and a baseline entry.
MAX_OPS = 15
#: Steps profiled after the warmup by the pytest plugin's escalation, unless told otherwise.
DEFAULT_PROFILE_STEPS = 5
#: Op names are cut to this many characters (a record_function label can be anything).
MAX_NAME_CHARS = 200
#: The key of a baseline entry's top ops (a summary recorded with ``--traceml-profile``).
SUMMARY_KEY = "profile"
#: Environment variable: profile this many steps after the warmup (0 or unset: off), so a
#: launched child (``traceml-ci run``, the plugin's ``run_script``) profiles too.
ENV_PROFILE_STEPS = "TRACEML_CI_PROFILE_STEPS"
#: top_ops.json is a few KB; a bigger file is not one.
MAX_TOP_OPS_BYTES = 1024 * 1024


def profile_dir(out_dir: str | os.PathLike[str]) -> Path:
    return Path(out_dir) / PROFILE_DIRNAME


@dataclass(frozen=True)
class OpTime:
    """One op (or record_function label), per profiled step: self time on the host and on the
    device (None without a device activity), calls, and its share of all ops' self time."""

    name: str
    host_self_ms: float
    device_self_ms: float | None
    calls: float
    share_pct: float

    @property
    def self_ms(self) -> float:
        """What ops are ranked by: host plus device self time per step."""
        return self.host_self_ms + (self.device_self_ms or 0.0)


@dataclass(frozen=True)
class TopOps:
    """The top ops of ``steps`` profiled steps (``device``: "cpu" or e.g. "cuda")."""

    steps: int
    device: str
    total_self_ms: float
    ops: tuple[OpTime, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": TOP_OPS_VERSION,
            "kind": TOP_OPS_KIND,
            "steps": self.steps,
            "device": self.device,
            "total_self_ms": round(self.total_self_ms, 6),
            "ops": [
                {
                    "name": o.name,
                    "host_self_ms": round(o.host_self_ms, 6),
                    "device_self_ms": (None if o.device_self_ms is None
                                       else round(o.device_self_ms, 6)),
                    "calls": round(o.calls, 3),
                    "share_pct": round(o.share_pct, 3),
                }
                for o in self.ops
            ],
        }


def top_ops(
    rows: Sequence[tuple[str, float, float | None, int]], *, steps: int, device: str,
    limit: int = MAX_OPS,
) -> TopOps:
    """The top ``limit`` ops by self time per step, from ``(name, host_self_ms,
    device_self_ms or None, calls)`` totals over ``steps`` steps (torch.profiler's
    ``key_averages``, already in ms)."""
    n = max(1, int(steps))
    per_step = [
        (name[:MAX_NAME_CHARS], host / n, None if dev is None else dev / n, calls / n)
        for name, host, dev, calls in rows
    ]
    total = sum(h + (d or 0.0) for _, h, d, _ in per_step)
    per_step.sort(key=lambda r: (-(r[1] + (r[2] or 0.0)), r[0]))
    ops = tuple(
        OpTime(name, host, dev, calls, 100.0 * (host + (dev or 0.0)) / total if total else 0.0)
        for name, host, dev, calls in per_step[:limit]
    )
    return TopOps(steps=int(steps), device=device, total_self_ms=total, ops=ops)


def parse_top_ops(doc: Any, where: str) -> TopOps:
    """A top-ops document; InputError(where, problem) when it is not a valid one."""
    from traceml_ci.summary.schema import major

    if not isinstance(doc, Mapping) or doc.get("kind") != TOP_OPS_KIND:
        raise InputError(where, f"not a top-ops document (expected kind {TOP_OPS_KIND!r})")
    version = doc.get("schema_version")
    if not isinstance(version, str) or major(version) != major(TOP_OPS_VERSION):
        raise InputError(where, f"top-ops schema_version must be {TOP_OPS_VERSION!r}-compatible, "
                                f"not {version!r}")
    steps, device, total, ops = (doc.get(k) for k in ("steps", "device", "total_self_ms", "ops"))
    if whole(steps) is None or steps < 1:
        raise InputError(where, "top ops: steps must be an integer >= 1")
    if not isinstance(device, str):
        raise InputError(where, "top ops: device must be a string")
    if not _number(total) or not isinstance(ops, list) or len(ops) > 10 * MAX_OPS:
        raise InputError(where, "top ops: total_self_ms must be a number and ops a short list")
    parsed = []
    for i, op in enumerate(ops):
        name = op.get("name") if isinstance(op, Mapping) else None
        dev = op.get("device_self_ms") if isinstance(op, Mapping) else None
        fields = [op.get(k) for k in ("host_self_ms", "calls", "share_pct")] if name else []
        if (not isinstance(name, str) or len(name) > MAX_NAME_CHARS
                or not all(_number(v) for v in fields) or not (dev is None or _number(dev))):
            raise InputError(where, f"top ops: ops[{i}] needs a name (at most {MAX_NAME_CHARS} "
                                    "characters), host_self_ms, calls, share_pct as numbers")
        parsed.append(OpTime(name, float(fields[0]), None if dev is None else float(dev),
                             float(fields[1]), float(fields[2])))
    return TopOps(steps=steps, device=device, total_self_ms=float(total), ops=tuple(parsed))


def read_top_ops(path: str | os.PathLike[str]) -> TopOps:
    """``top_ops.json``; InputError naming the file when it is missing, not JSON, or not a
    top-ops document."""
    from traceml_ci.summary.io import read_json

    return parse_top_ops(read_json(Path(path), MAX_TOP_OPS_BYTES), str(path))


def write_top_ops(path: str | os.PathLike[str], top: TopOps) -> Path:
    """Write ``top`` atomically (temp file + os.replace)."""
    import json

    from traceml_ci.fsutil import atomic_write_text

    return atomic_write_text(path, json.dumps(top.to_dict(), indent=1, allow_nan=False) + "\n")


def summary_top_ops(summary: Mapping[str, Any], where: str = "summary") -> TopOps | None:
    """The top ops a baseline entry carries (recorded with ``--traceml-profile``), or None."""
    doc = summary.get(SUMMARY_KEY)
    return None if doc is None else parse_top_ops(doc, f"{where}: {SUMMARY_KEY}")


def with_top_ops(summary: Mapping[str, Any], top: TopOps) -> dict[str, Any]:
    """A copy of ``summary`` carrying ``top`` (what a baseline entry stores)."""
    return {**summary, SUMMARY_KEY: top.to_dict()}


@dataclass(frozen=True)
class OpDelta:
    """One op's self time per step, base -> head (None: the op is not in that side's top)."""

    name: str
    base_ms: float | None
    head_ms: float | None

    @property
    def delta_ms(self) -> float:
        return (self.head_ms or 0.0) - (self.base_ms or 0.0)


def op_deltas(base: TopOps, head: TopOps) -> list[OpDelta]:
    """Ops matched by name, base -> head, largest change first (|Δ ms|, then name). An op in
    only one side's top list is new or gone (its other side None)."""
    b = {o.name: o.self_ms for o in base.ops}
    h = {o.name: o.self_ms for o in head.ops}
    out = [OpDelta(name, b.get(name), h.get(name)) for name in b.keys() | h.keys()]
    out.sort(key=lambda d: (-abs(d.delta_ms), d.name))
    return out


def _number(x: Any) -> bool:
    return finite(x) is not None
