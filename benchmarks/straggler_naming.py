"""How often the merged summary names the right straggler: examples/train_ddp.py on 2 CPU ranks.

    .venv/bin/python benchmarks/straggler_naming.py [--runs 3] [--hogs 2] [--cases data forward]

Each case is run ``--runs`` times through ``traceml-ci run --nproc-per-node 2``: rank 1 slowed
(``--slow-ms``, default the example's 6 ms) in its dataloader, forward, backward or optimizer,
or no rank slowed (balanced). ``--hogs N`` starts N busy Python loops beside every run (killed
at the end). A run is right when its merged summary's ``distributed.straggler`` has the
expected label, rank and cause (balanced: ``RANKS_BALANCED``). Prints one line per run
(label, rank, cause, score, lateness, each rank's runqueue wait) and the counts per case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_ddp.py"
SLOW_RANK = 1
#: case -> (label, cause) the merged summary should name.
EXPECTED = {
    "data": ("INPUT_STRAGGLER", "dataloader"),
    "forward": ("COMPUTE_STRAGGLER", "forward"),
    "backward": ("COMPUTE_STRAGGLER", "backward"),
    "optimizer": ("STRAGGLER", "optimizer"),
    "balanced": ("RANKS_BALANCED", None),
}


def _run(case: str, slow_ms: float, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        slow = [] if case == "balanced" else ["--slow-rank", str(SLOW_RANK), "--slow", case,
                                              "--slow-ms", str(slow_ms)]
        cmd = [sys.executable, "-m", "traceml_ci", "run", "--no-live", "--out", tmp,
               "--progress-interval", "0", "--nproc-per-node", "2", str(EXAMPLE),
               "--steps", str(steps), *slow]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        merged = Path(tmp) / "final_summary.json"
        if out.returncode != 0 or not merged.exists():
            return {"error": f"exit {out.returncode}: {out.stderr[-500:]}"}
        return json.loads(merged.read_text())["distributed"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--hogs", type=int, default=0, help="busy loops beside every run")
    p.add_argument("--cases", nargs="*", default=list(EXPECTED), choices=list(EXPECTED))
    p.add_argument("--slow-ms", type=float, default=6.0)
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.hogs)]
    counts: dict[str, int] = {}
    try:
        for case in args.cases:
            label, cause = EXPECTED[case]
            counts[case] = 0
            for i in range(args.runs):
                block = _run(case, args.slow_ms, args.steps)
                if "error" in block:
                    print(f"{case} #{i + 1}: {block['error']}", flush=True)
                    continue
                s = block["straggler"]
                rank = SLOW_RANK if label != "RANKS_BALANCED" else None
                right = (s.get("label"), s.get("rank"), s.get("cause")) == (label, rank, cause)
                counts[case] += right
                waits = [r.get("runqueue_wait_pct") for r in block["ranks"]]
                own = [r.get("own_work_ms") for r in block["ranks"]]
                noise = [r.get("own_work_noise_ms") for r in block["ranks"]]
                print(f"{case} #{i + 1}: {'ok ' if right else 'MISS'} {s.get('label')} "
                      f"rank={s.get('rank')} cause={s.get('cause')} score={s.get('score_pct')} "
                      f"lateness={s.get('lateness_ms')} own_ms={own} noise_ms={noise} "
                      f"runqueue%={waits} steps={[r.get('step_ms_median') for r in block['ranks']]}"
                      + "".join(f" {k}={s[k]!r}" for k in ("noisy", "contended") if k in s),
                      flush=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print("right label and rank / runs: " + ", ".join(
        f"{case} {n}/{args.runs}" for case, n in counts.items()) +
        (f" (beside {args.hogs} busy loops)" if args.hogs else ""))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
