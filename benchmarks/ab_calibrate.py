"""A/B mode on a loaded runner: record interleaved rounds, then replay gate runs on them.

    python benchmarks/ab_calibrate.py record --out /tmp/abcal [--rounds 60] [--variants ...]
    python benchmarks/ab_calibrate.py judge --out /tmp/abcal

``record`` runs ``benchmarks/gate_job.py`` under ``traceml-ci run`` for base and head in ABBA
order, round after round, while 0-2 CPU hogs start and stop at random moments (every 1-8 s):
the load a shared runner sees, hitting both sides alike only on average. Each variant is a
head made slower in one way, sized from the first A/A rounds' figures (``dl+2pp``: dataloader
share +2 pp; ``step+5%``: step time +5 % in forward; ``dl+25%``: input cost +25 %). Every run's
figures go to ``<out>/<variant>.jsonl`` as they come (resumable).

``judge`` replays gate runs the way ``traceml-ci ab`` takes them: each gate run takes rounds from
the recorded sequence until ``gate.ab.decide`` gives a verdict, the next starts at the round
after; it prints the verdicts and mean rounds per variant, with the settings given.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gate_common import EXE, HOG, ab_gate_runs  # noqa: E402

JOB = REPO / "benchmarks" / "gate_job.py"
VARIANTS = ("aa", "aa2", "dl+2pp", "step+5%", "dl+25%")


class RandomHogs:
    """0-2 busy loops, their number redrawn every 1-8 s, until stopped."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RandomHogs:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._set(0)

    def _set(self, n: int) -> None:
        while len(self._procs) > n:
            proc = self._procs.pop()
            proc.kill()
            proc.wait()
        while len(self._procs) < n:
            self._procs.append(subprocess.Popen([sys.executable, "-c", HOG]))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._set(self._rng.choice((0, 1, 2)))
            self._stop.wait(self._rng.uniform(1.0, 8.0))


def figures(args: list[str]) -> dict[str, Any]:
    """One traced run of the job: median step ms, shares, contention."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([EXE, "run", "--out", tmp, str(JOB), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        doc = json.loads((Path(tmp) / "final_summary.json").read_text())
    st = doc["step_time"]
    return {
        "step_ms": st["step_ms"]["median"],
        "step": st["step_ms"],
        "phase_ms": st.get("phase_ms"),
        "shares": {p: st[f"{p}_pct"] for p in ("dataloader", "forward", "backward", "optimizer",
                                                 "other")},
        "runqueue_wait_pct": ((doc["run"].get("contention") or {}).get("runqueue_wait_pct")),
    }


def head_args(variant: str, base: list[dict[str, Any]]) -> list[str]:
    """The head's knobs, sized from the A/A rounds' base figures (medians)."""
    if variant.startswith("aa"):
        return []
    step = sorted(r["step_ms"] for r in base)[len(base) // 2]
    dl_pct = sorted(r["shares"]["dataloader"] for r in base)[len(base) // 2]
    dl_ms = step * dl_pct / 100.0
    if variant == "dl+2pp":  # (dl + x) / (step + x) = dl_pct + 2
        share = (dl_pct + 2.0) / 100.0
        extra = (share * step - dl_ms) / (1.0 - share)
        return ["--dataset-ms", f"{extra:.4f}"]
    if variant == "step+5%":
        return ["--forward-ms", f"{0.05 * step:.4f}"]
    if variant == "dl+25%":
        return ["--dataset-ms", f"{0.25 * 1.5:.4f}"]  # gate_job's base dataset cost is 1.5 ms
    raise SystemExit(f"unknown variant {variant}")


def record(out: Path, rounds: int, variants: list[str]) -> None:
    from traceml_ci.gate.ab.sequential import Side, round_order

    out.mkdir(parents=True, exist_ok=True)
    # A kill unwinds like Ctrl-C, so the hogs are stopped with us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with RandomHogs():
        for variant in variants:
            path = out / f"{variant}.jsonl"
            done = path.read_text().splitlines() if path.exists() else []
            aa = [json.loads(x)["base"] for x in (out / "aa.jsonl").read_text().splitlines()] \
                if variant != "aa" else []
            args = head_args(variant, aa)
            for n in range(len(done) + 1, rounds + 1):
                got = {}
                for side in round_order(n):
                    got[side.value] = figures(args if side is Side.HEAD else [])
                with path.open("a") as f:
                    f.write(json.dumps({"round": n, "head_args": args, **got}) + "\n")
                print(f"{variant}: round {n}/{rounds}", file=sys.stderr, flush=True)


def _side(rec: dict[str, Any]) -> Any:
    from traceml_ci.gate.ab.sequential import SideFigures

    return SideFigures(rec["step_ms"], rec["shares"], phase_ms=rec.get("phase_ms"))


def judge(out: Path, settings: Any) -> None:
    from traceml_ci.gate.ab.sequential import RoundPair

    for variant in VARIANTS:
        path = out / f"{variant}.jsonl"
        if not path.exists():
            continue
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        pairs = [RoundPair(i + 1, _side(r["base"]), _side(r["head"])) for i, r in enumerate(recs)]
        gate_runs = ab_gate_runs(pairs, settings)
        verdicts = Counter(r.verdict.value if r.verdict else "undecided" for r, _ in gate_runs)
        used, runs = sum(n for _, n in gate_runs), len(gate_runs)
        waits = [r[s]["runqueue_wait_pct"] or 0.0 for r in recs for s in ("base", "head")]
        print(f"{variant:>8}: {runs} gate runs over {len(pairs)} rounds "
              f"(runqueue wait median {sorted(waits)[len(waits) // 2]:.0f} %, max "
              f"{max(waits):.0f} %): {dict(verdicts)}; mean rounds "
              f"{used / runs if runs else 0:.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("record", "judge"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--step-tolerance", type=float, default=None)
    p.add_argument("--share-tolerance", type=float, default=None)
    p.add_argument("--rounds-max", type=int, default=None)
    args = p.parse_args()
    if args.action == "record":
        record(args.out, args.rounds, args.variants.split(","))
        return 0
    from traceml_ci.gate.ab.sequential import AbSettings

    given = {k: v for k, v in (("step_tol_pct", args.step_tolerance),
                               ("share_tol_pp", args.share_tolerance),
                               ("max_rounds", args.rounds_max)) if v is not None}
    judge(args.out, AbSettings(**given))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
