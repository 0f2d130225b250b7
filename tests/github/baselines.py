"""Baselines made from real summaries, shifted on purpose."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def slowed_baseline(
    summaries: Path, factor: float = 10.0, shift_pp: float = 30.0
) -> dict[str, Any]:
    """A baseline set in which every step took 1/factor of the time it takes in ``summaries``,
    and ``shift_pp`` of the dataloader's share was forward's: against it, the head run is slower
    AND its time moved into waiting for data -- a regression on any runner (on CPU, its CPU per
    step ``factor`` times the baseline's, past the host clock's 4x band)."""
    doc = json.loads(summaries.read_text())
    for summary in doc["summaries"].values():
        st = summary["step_time"]
        moved = min(shift_pp, st["dataloader_pct"])
        st["dataloader_pct"] -= moved
        st["forward_pct"] += moved
        if isinstance(st.get("phase_ms"), dict) and st["phase_ms"].get("dataloader"):
            st["phase_ms"]["dataloader"] *= st["dataloader_pct"] / (st["dataloader_pct"] + moved)
        for k in ("step_ms", "phase_ms"):
            if isinstance(st.get(k), dict):
                st[k] = {n: v / factor if isinstance(v, (int, float)) else v
                         for n, v in st[k].items()}  # fmt: skip
        if isinstance(st.get("cpu_ms"), (int, float)):  # the host clock's band judges this
            st["cpu_ms"] /= factor
        noise = st.get("noise") or {}
        if isinstance(noise.get("step_ms"), dict):
            noise["step_ms"] = {n: v / factor for n, v in noise["step_ms"].items()}
        tp = st.get("throughput") or {}
        for k, v in list(tp.items()):
            if isinstance(v, (int, float)) and k.endswith("_per_s"):
                tp[k] = v * factor
    return doc
