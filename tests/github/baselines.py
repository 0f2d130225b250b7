"""Baselines made from real summaries, shifted on purpose."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def slowed_baseline(summaries: Path, factor: float = 10.0) -> dict[str, Any]:
    """A baseline set in which every step took 1/factor of the time it takes in ``summaries``."""
    doc = json.loads(summaries.read_text())
    for summary in doc["summaries"].values():
        st = summary["step_time"]
        for k in ("step_ms", "phase_ms"):
            if isinstance(st.get(k), dict):
                st[k] = {n: v / factor if isinstance(v, (int, float)) else v
                         for n, v in st[k].items()}  # fmt: skip
        noise = st.get("noise") or {}
        if isinstance(noise.get("step_ms"), dict):
            noise["step_ms"] = {n: v / factor for n, v in noise["step_ms"].items()}
        tp = st.get("throughput") or {}
        for k, v in list(tp.items()):
            if isinstance(v, (int, float)) and k.endswith("_per_s"):
                tp[k] = v * factor
    return doc
