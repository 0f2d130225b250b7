"""Render one frame of the live view to docs/live-view.svg (the README's picture).

    python docs/render_live_frame.py            # rewrites docs/live-view.svg
    python docs/render_live_frame.py --out X.svg

The frame is drawn by the view's own code (``traceml_ci.cli.live_view.render_frame``) from
snapshots made the tracer's way (``snapshot_from_summary``) out of two summaries the tracer wrote
for examples/input_bound.py (tests/gate/data/input_bound_{a,b}.json), shown as two ranks of one
job: their shares, step times, diagnoses, memory and throughput are recorded. The step-time
history and the first window's shares are illustrative (a summary keeps neither). A test checks
that the committed SVG is what this script draws.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "gate" / "data"
SVG = ROOT / "docs" / "live-view.svg"
NOW = 1_764_600_000.0
WIDTH = 100
#: Illustrative: where the split stood in the first window after warmup.
FIRST_WINDOW_PCT = {"dataloader": 64.0, "forward": 9.5, "backward": 13.0, "optimizer": 4.5,
                    "other": 9.0}


def _history(summary: dict[str, Any], points: int = 60) -> list[float]:
    """Illustrative step-time medians between the run's p10 and p90: a drift up as the input
    pipeline falls behind, with a wobble."""
    ms = summary["step_time"]["step_ms"]
    lo, hi = ms["p10"], ms["p90"]
    return [round(lo + (hi - lo) * (0.5 * i / points + 0.5 * ((i * 7) % 11) / 10), 3)
            for i in range(points)]


def snapshots() -> list[dict[str, Any]]:
    """Two ranks' snapshots from the recorded summaries."""
    from traceml_ci.summary.live import snapshot_from_summary

    out = []
    for rank, (name, beat_age) in enumerate((("input_bound_a", 0.3), ("input_bound_b", 0.6))):
        summary = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
        st, mem = summary["step_time"], summary["step_memory"]
        out.append(snapshot_from_summary(
            summary,
            steps_done=st["steps_total"] * 8 - rank * 3,
            steps_per_s=st["throughput"]["steps_per_s"],
            history_ms=_history(summary),
            first_window_pct=FIRST_WINDOW_PCT,
            memory={"rss_mb": mem["peak_rss_mb"], "allocated_mb": mem["peak_allocated_mb"],
                    "reserved_mb": mem["peak_reserved_mb"],
                    "growth_mb_per_1k_steps": mem["growth_mb_per_1k_steps"],
                    "growth_basis": mem["growth_basis"]},
            identity={"run_name": summary["run"]["name"], "rank": rank, "local_rank": rank,
                      "world_size": 2, "host": "ci-runner-7", "pid": 4242 + rank,
                      "started_at": "2025-12-01T14:39:50Z"},
            heartbeat=NOW - beat_age,
        ))
    return out


def render_svg() -> str:
    """The SVG of the frame, as rich exports it."""
    from rich.console import Console

    from traceml_ci.cli.live_view import render_frame

    console = Console(record=True, width=WIDTH, force_terminal=True, color_system="truecolor",
                      file=io.StringIO())
    console.print(render_frame(snapshots(), now=NOW, width=WIDTH))
    return console.export_svg(title="traceml-ci watch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SVG, help=f"where to write (default {SVG})")
    args = parser.parse_args()
    args.out.write_text(render_svg(), encoding="utf-8")
    print(args.out)


if __name__ == "__main__":
    main()
