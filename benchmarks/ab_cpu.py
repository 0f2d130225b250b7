"""Wall time against CPU time per step in A/B rounds on a loaded runner (docs/gate.md, "A/B
mode", "step CPU time").

    python benchmarks/ab_cpu.py --out /tmp/abcpu [--rounds 8] [--variants aa,fwd+5%,fwd+20%]
                                [--hogs random|2]

Beside the runs: 0-2 busy loops whose number is redrawn every 1-8 s (``--hogs random``, the
default: load that comes and goes within a run), or two for the whole measurement. Each variant
runs ``benchmarks/gate_job.py --fixed-work`` under ``traceml-ci run`` for base and head in ABBA
order, both with the CPU reference on (``TRACEML_CI_CPU_REFERENCE=1``, as A/B mode runs them);
the head of ``fwd+X%`` adds fixed work in forward, X % of the base's CPU ms per step (sized
from the A/A rounds); the head of ``io+Xms`` sleeps X ms more per batch (blocked time); the
head of ``dl+X%`` does X % more work per batch in its dataset (heavier augmentation).
Each run's median step ms, ``cpu_ms``, ``cpu_reference_ms``, the thread's split, the figures
over its uncontended windows and the shares go to ``<out>/<variant>.jsonl`` as they come
(resumable). At the end, per variant: the SD of
the rounds' log ratios of wall time, CPU time, CPU time in units of the reference and step time
without CPU waits, their means,
and the verdicts of ``gate.ab.decide`` replayed as gate runs over the recorded rounds: on
wall time alone, with the CPU ratio, as the gate ran before the uncontended windows (whole-run
figures), and as it runs now -- back to back as a CI job makes them, and from every start
round with ``max_rounds`` left (overlapping windows: more runs from the same rounds).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.ab_calibrate import RandomHogs  # noqa: E402
from benchmarks.gate_common import EXE, HOG, ab_gate_runs  # noqa: E402
from traceml_ci.childenv import child_env  # noqa: E402
from traceml_ci.summary.keys import ENV_CPU_REFERENCE  # noqa: E402

JOB = REPO / "benchmarks" / "gate_job.py"
VARIANTS = ("aa", "fwd+5%", "fwd+20%", "io+1ms", "dl+25%")
#: gate_job.py's --base-dataset-ms default: the work per batch a dl+X% head adds X % to.
BASE_DATASET_MS = 1.5
#: gate_job's ms of fixed work are WORK_PER_MS iterations each; CPU ms per iteration differs,
#: so the head's extra is sized from the A/A base's CPU ms and this measured rate.
CALIBRATE = (
    "import sys,time; sys.path.insert(0,'benchmarks'); import gate_job as g; "
    "t=time.thread_time(); g.work(2_000_000); "
    "print((time.thread_time()-t)*1e3/(2_000_000/g.WORK_PER_MS))"
)


def figures(args: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([EXE, "run", "--out", tmp, str(JOB), "--fixed-work", *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=child_env(None, {ENV_CPU_REFERENCE: "1"}))
        doc = json.loads((Path(tmp) / "final_summary.json").read_text())
    from traceml_ci.summary.view import SummaryView

    st, view = doc["step_time"], SummaryView(doc)
    return {"step_ms": st["step_ms"]["median"], "cpu_ms": st.get("cpu_ms"),
            "cpu_reference_ms": st.get("cpu_reference_ms"),
            "runqueue_wait_pct": (doc["run"].get("contention") or {}).get("runqueue_wait_pct"),
            "thread": st.get("thread"), "uncontended": st.get("uncontended"),
            "steps_analyzed": st.get("steps_analyzed"), "shares": dict(view.shares()),
            "phase_ms": {p: view.phase_ms(p) for p in view.phases}}


def head_args(variant: str, out: Path) -> list[str]:
    if variant.startswith("aa"):
        return []
    if variant.startswith("io+"):  # blocked time: the head's batches also sleep this long
        return ["--io-ms", variant.removeprefix("io+").removesuffix("ms")]
    if variant.startswith("dl+"):  # the input pipeline's work per batch, X % more
        pct = float(variant.removeprefix("dl+").removesuffix("%"))
        return ["--dataset-ms", f"{pct / 100.0 * BASE_DATASET_MS:.4f}"]
    pct = float(variant.removeprefix("fwd+").removesuffix("%"))
    aa = [json.loads(x)["base"] for x in (out / "aa.jsonl").read_text().splitlines()]
    cpu = statistics.median(r["cpu_ms"] for r in aa)
    per_unit = float(subprocess.run([sys.executable, "-c", CALIBRATE], cwd=REPO, check=True,
                                    capture_output=True, text=True).stdout)
    return ["--forward-ms", f"{pct / 100.0 * cpu / per_unit:.4f}"]


def record(out: Path, rounds: int, variants: list[str]) -> None:
    from traceml_ci.gate.ab.sequential import Side, round_order

    out.mkdir(parents=True, exist_ok=True)
    for variant in variants:
        path = out / f"{variant}.jsonl"
        done = path.read_text().splitlines() if path.exists() else []
        args = json.loads(done[0])["head_args"] if done else head_args(variant, out)
        for n in range(len(done) + 1, rounds + 1):
            got = {side.value: figures(args if side is Side.HEAD else [])
                   for side in round_order(n)}
            with path.open("a") as f:
                f.write(json.dumps({"round": n, "head_args": args, **got}) + "\n")
            print(f"{variant}: round {n}/{rounds}", file=sys.stderr, flush=True)


def gate_side(r: dict[str, Any], uncontended: bool = True) -> Any:
    """One recorded run as the gate reads it from a summary (a ``gate.ab.SideFigures``);
    ``uncontended=False``: without its uncontended windows, as the gate ran before them."""
    from traceml_ci.gate.ab.rounds import uncontended_figures
    from traceml_ci.gate.ab.sequential import SideFigures

    return SideFigures(r["step_ms"], r.get("shares") or {}, phase_ms=r.get("phase_ms"),
                       cpu_ms=r["cpu_ms"], cpu_reference_ms=r.get("cpu_reference_ms"),
                       thread=r.get("thread"),
                       uncontended=(uncontended_figures(r.get("uncontended"),
                                                        r.get("steps_analyzed"))
                                    if uncontended else None))


def report(out: Path, variants: list[str], rounds_max: int | None = None) -> None:
    from traceml_ci.gate.ab.sequential import AbSettings, RoundPair, SideFigures

    def side(r: dict[str, Any], cpu: str) -> SideFigures:
        if cpu in ("gate", "whole run"):  # everything the gate reads from a summary
            return gate_side(r, uncontended=cpu == "gate")
        ref = r.get("cpu_reference_ms") if cpu == "referenced" else None
        return SideFigures(r["step_ms"], {}, cpu_ms=r["cpu_ms"] if cpu != "off" else None,
                           cpu_reference_ms=ref)

    settings = AbSettings() if rounds_max is None else AbSettings(max_rounds=rounds_max)
    print(f"gate runs replayed with at most {settings.max_rounds} rounds each")
    for variant in variants:
        path = out / f"{variant}.jsonl"
        if not path.exists():
            continue
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        wall = [math.log(r["head"]["step_ms"] / r["base"]["step_ms"]) for r in recs]
        cpu = [math.log(r["head"]["cpu_ms"] / r["base"]["cpu_ms"]) for r in recs]
        referenced = [math.log((r["head"]["cpu_ms"] / r["head"]["cpu_reference_ms"])
                               / (r["base"]["cpu_ms"] / r["base"]["cpu_reference_ms"]))
                      for r in recs
                      if r["head"].get("cpu_reference_ms") and r["base"].get("cpu_reference_ms")]
        waits = [r[s]["runqueue_wait_pct"] or 0.0 for r in recs for s in ("base", "head")]
        print(f"{variant:>8}: {len(recs)} rounds, runqueue wait median "
              f"{statistics.median(waits):.0f} %, head args {recs[0]['head_args']}")
        gate = [RoundPair(1, side(r["base"], "gate"), side(r["head"], "gate")) for r in recs]
        whole = [RoundPair(1, side(r["base"], "whole run"), side(r["head"], "whole run"))
                 for r in recs]
        unloaded = [math.log(x) for x in (p.unloaded_ratio for p in whole) if x]
        quiet_pairs = [p for p in gate if p.uncontended]
        print(f"          rounds with both sides' uncontended windows: {len(quiet_pairs)}")
        q_ref = [math.log(x) for x in (p.cpu_ratio for p in quiet_pairs) if x]
        q_unl = [math.log(x) for x in (p.unloaded_ratio for p in quiet_pairs) if x]
        for name, logs in (("wall", wall), ("cpu", cpu), ("cpu/ref", referenced),
                           ("no waits", unloaded), ("quiet cpu/ref", q_ref),
                           ("quiet no waits", q_unl)):
            if len(logs) < 2:
                continue
            print(f"          {name:14}: mean {100 * math.expm1(statistics.mean(logs)):+6.1f} %, "
                  f"per-round SD {100 * statistics.stdev(logs):5.1f} %  ("
                  + " ".join(f"{100 * math.expm1(v):+.0f}" for v in logs) + ")")
        for label, cpu in (("wall only", "off"), ("with step_cpu", "raw"),
                           ("with step_cpu per reference", "referenced"),
                           ("the gate on whole-run figures", "whole run"),
                           ("the gate (uncontended windows)", "gate")):
            pairs = [RoundPair(i + 1, side(r["base"], cpu), side(r["head"], cpu))
                     for i, r in enumerate(recs)]
            verdicts, moved, rounds = replay(pairs, settings)
            print(f"          gate runs, {label}: {dict(verdicts)}; regressed {dict(moved)}; "
                  f"mean rounds {statistics.mean(rounds):.1f}")
            if cpu in ("whole run", "gate"):
                verdicts, moved, rounds = replay(pairs, settings, every_start=True)
                print(f"            from every start round: {dict(verdicts)}; regressed "
                      f"{dict(moved)}; mean rounds {statistics.mean(rounds):.1f}")


def replay(pairs: list[Any], settings: Any, every_start: bool = False
           ) -> tuple[Counter[str], Counter[str], list[int]]:
    """The verdicts of the gate runs over the recorded rounds, the metrics they regressed and
    the rounds each took (``every_start``: as ``gate_common.ab_gate_runs``)."""
    verdicts: Counter[str] = Counter()
    moved: Counter[str] = Counter()
    rounds = []
    for result, n in ab_gate_runs(pairs, settings, every_start):
        verdicts[result.verdict.value if result.verdict else "undecided"] += 1
        moved.update(iv.metric for iv in result.regressed)
        rounds.append(n)
    return verdicts, moved, rounds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--hogs", choices=("random", "2"), default="random")
    p.add_argument("--rounds-max", type=int, default=None,
                   help="the replayed gate runs' cap (default: traceml-ci ab's)")
    args = p.parse_args()
    variants = args.variants.split(",")
    if not args.report_only:
        # A kill unwinds like Ctrl-C, so the hogs are stopped with us.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        if args.hogs == "random":
            with RandomHogs():
                record(args.out, args.rounds, variants)
        else:
            hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]
            try:
                record(args.out, args.rounds, variants)
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
    report(args.out, variants, args.rounds_max)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
