"""Detection: inject real slowdowns into a training job and count how often diff catches them.

    .venv/bin/python benchmarks/gate_detection.py [--bases 8] [--heads 8] [--repeats 3] [--keep DIR]

benchmarks/gate_job.py runs ``--bases`` times unchanged; then, for each target shift of the
dataloader's share (pp), the extra ms per batch that produces it is computed from the base
runs and injected (``--dataset-ms``), and the job runs ``--heads`` times; one more series
slows the forward (``--forward-ms``). Every (base, head) pair is diffed at the default rules;
detection rate = share of pairs with a ``regression`` verdict. Target: >= 99% at 8 pp or more.
The measured shift (median head share - median base share) is reported beside the target.
``--hogs N`` runs every head beside N busy-loop processes (the bases stay quiet): detection on
a loaded runner, where the contention guard excuses what the measured waits can explain.
``--repeats R`` also judges every pair of R-run combinations (``traceml-ci combine``) of the
same runs: what a CI job running the smoke test R times a side would see. "plugin policy" is
the pytest plugin's default (``gate_common.judge_sequential``): a baseline of 3 runs combined,
the head's first run judged and re-run, up to 2 more, while it regresses or comes close --
with the runs it took per head job.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_common import (  # noqa: E402
    judge_combined,
    judge_pairs,
    judge_sequential,
    pct,
    run_many,
)

JOB = Path(__file__).resolve().parent / "gate_job.py"
SHIFTS_PP = (2.0, 4.0, 8.0, 12.0)
FORWARD_PP = 8.0


def extra_ms(share_pct: float, step_ms: float, target_pp: float) -> float:
    """ms to add to a phase holding ``share_pct`` of a ``step_ms`` step so that its share rises
    by ``target_pp``: (a + x) / (S + x) = p  =>  x = (p S - a) / (1 - p)."""
    a = share_pct / 100.0 * step_ms
    p = (share_pct + target_pp) / 100.0
    return (p * step_ms - a) / (1.0 - p)


def median_share(docs: list[dict], phase: str) -> float:
    return statistics.median(d["step_time"][f"{phase}_pct"] for d in docs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bases", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--keep", type=Path, help="folder for the summaries (reused when present)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--hogs", type=int, default=0,
                   help="CPU hogs beside every head run (the bases stay quiet): detection on a "
                   "loaded runner")
    p.add_argument("--repeats", type=int, default=3,
                   help="also judge combined summaries of this many runs per side (default 3)")
    args = p.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="gate-det-"))

    bases = run_many(JOB, root / "base", args.bases, label="base")
    step = statistics.median(d["step_time"]["step_ms"]["median"] for d in bases)
    dl, fw = median_share(bases, "dataloader"), median_share(bases, "forward")
    print(f"base: step {step:.2f} ms, dataloader {dl:.1f}%, forward {fw:.1f}%, labels "
          f"{sorted({d['step_time']['diagnosis'] for d in bases})}")
    null = judge_pairs(bases)
    null_reg = null["verdicts"].get("regression", 0)
    print(f"base vs base (no shift): regression {pct(null_reg, null['pairs'])} of "
          f"{null['pairs']} ordered pairs")

    series = [("dataloader", t, ["--dataset-ms", f"{extra_ms(dl, step, t):.3f}"])
              for t in SHIFTS_PP]
    forward_ms = extra_ms(fw, step, FORWARD_PP)
    series.append(("forward", FORWARD_PP, ["--forward-ms", f"{forward_ms:.3f}"]))
    rows = []
    for phase, target, inject in series:
        loaded = f"-hogs{args.hogs}" if args.hogs else ""
        heads = run_many(JOB, root / f"{phase}+{target:g}pp{loaded}", args.heads, inject,
                         hogs=args.hogs,
                         label=f"{phase} +{target:g} pp")
        measured = median_share(heads, phase) - median_share(bases, phase)
        res = judge_pairs(bases, heads)
        caught = res["verdicts"].get("regression", 0)
        on_metric = res["regressed"].get(f"step_time.{phase}_pct", 0)
        comb = judge_combined(bases, heads, args.repeats)
        policy = judge_sequential(bases, heads)
        rows.append({"phase": phase, "target_pp": target, "inject": inject,
                     "measured_pp": round(measured, 2), "pairs": res["pairs"],
                     "detected": caught, "rate": caught / res["pairs"],
                     "flagged_on_the_phase_share": on_metric, "verdicts": res["verdicts"],
                     "combined_pairs": comb["pairs"],
                     "combined_detected": comb["verdicts"].get("regression", 0),
                     "policy_jobs": policy["pairs"],
                     "policy_detected": policy["verdicts"].get("regression", 0),
                     "policy_runs_per_job": round(policy["runs_per_job"], 2)})
    r_n = args.repeats
    null_c = judge_combined(bases, None, r_n)
    print(f"base vs base, {r_n} runs combined per side: regression "
          f"{pct(null_c['verdicts'].get('regression', 0), null_c['pairs'])} of {null_c['pairs']}")
    null_p = judge_sequential(bases, None)
    print(f"base vs base, plugin policy: regression "
          f"{pct(null_p['verdicts'].get('regression', 0), null_p['pairs'])} of {null_p['pairs']}"
          f", {null_p['runs_per_job']:.2f} runs per job")
    print(f"\n{'shift':<22} {'measured':>9} {'pairs':>6} {'detected':>9}  share row regressed"
          f"  | x{r_n} combined: pairs detected | plugin policy: jobs detected runs/job")
    for r in rows:
        print(f"{r['phase']:>10} +{r['target_pp']:>4g} pp    {r['measured_pp']:>+7.2f}pp "
              f"{r['pairs']:>6} {pct(r['detected'], r['pairs']):>9}  "
              f"{pct(r['flagged_on_the_phase_share'], r['pairs']):>19}  | "
              f"{r['combined_pairs']:>6} {pct(r['combined_detected'], r['combined_pairs']):>8} | "
              f"{r['policy_jobs']:>5} {pct(r['policy_detected'], r['policy_jobs']):>8} "
              f"{r['policy_runs_per_job']:>5.2f}")
    print(f"summaries in {root}")
    if args.json:
        args.json.write_text(json.dumps({"base_step_ms": step, "null": null, "series": rows},
                                        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
