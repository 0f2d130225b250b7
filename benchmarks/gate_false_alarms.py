"""False alarms: run the same example job many times and diff every ordered pair of runs.

    .venv/bin/python benchmarks/gate_false_alarms.py [--runs 20] [--repeats 3 5] [--keep DIR]
        [EXAMPLE ...]

Nothing changed between runs, so every ``regression`` verdict is a false alarm (exit 1 in CI).
Target: at most 1% at the default rules. Warnings (exit 0) are reported too, as is the rate
with the noise rule off, to show what the noise rule buys. ``--keep DIR`` keeps the summaries
and reuses any already there, so a second run only re-judges. ``--repeats R`` also judges
disjoint R-run combinations (``traceml-ci combine``) of the same runs against each other.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_common import REPO, judge_combined, judge_pairs, pct, run_many  # noqa: E402

TARGET = 0.01


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("examples", nargs="*", default=["input_bound", "compute_bound"])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--keep", type=Path, help="folder for the summaries (reused when present)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--repeats", type=int, nargs="*", default=[3],
                   help="also judge combined summaries of this many runs per side (disjoint "
                   "groups of the same runs; default 3)")
    args = p.parse_args()

    from traceml_ci.gate import DEFAULT_RULES

    root = args.keep or Path(tempfile.mkdtemp(prefix="gate-fa-"))
    no_noise = DEFAULT_RULES.with_tolerances({}, noise_factor=0.0, source="noise rule off")
    results = {}
    total_pairs = total_regressions = 0
    total_comb: dict[int, list[int]] = {}
    for name in args.examples:
        script = REPO / "examples" / f"{name}.py"
        docs = run_many(script, root / name, args.runs, label=name)
        labels = {d["step_time"]["diagnosis"] for d in docs}
        res = judge_pairs(docs)
        off = judge_pairs(docs, rules=no_noise)
        results[name] = {"runs": len(docs), "labels": sorted(labels), "default": res,
                         "noise_rule_off": off}
        n, reg = res["pairs"], res["verdicts"].get("regression", 0)
        total_pairs += n
        total_regressions += reg
        print(f"\n{name}: {len(docs)} runs, {n} ordered pairs, labels {sorted(labels)}")
        print(f"  regression (false alarm): {reg} = {pct(reg, n)}")
        warn = res["verdicts"].get("warn", 0)
        print(f"  warn: {warn} = {pct(warn, n)}")
        print(f"  noise rule off: regression {pct(off['verdicts'].get('regression', 0), n)}")
        if res["regressed"]:
            print(f"  metrics that regressed: {res['regressed']}")
        if res["warned"]:
            print(f"  metrics that warned: {res['warned']}")
        for r in args.repeats:
            if 2 * r > len(docs):
                continue
            comb = judge_combined(docs, None, r)
            results[name][f"combined_x{r}"] = comb
            creg = comb["verdicts"].get("regression", 0)
            total_comb[r] = [a + b for a, b in zip(total_comb.get(r, [0, 0]),
                                                   (creg, comb["pairs"]), strict=True)]
            cwarn = comb["verdicts"].get("warn", 0)
            print(f"  {r} runs combined per side: regression {creg}/{comb['pairs']} = "
                  f"{pct(creg, comb['pairs'])}, warn {pct(cwarn, comb['pairs'])}")
    rate = total_regressions / total_pairs if total_pairs else 0.0
    print(f"\nfalse-alarm rate: {total_regressions}/{total_pairs} = {100 * rate:.2f}% "
          f"(target <= {100 * TARGET:.0f}%)  summaries in {root}")
    for r, (reg, n) in total_comb.items():
        print(f"false-alarm rate, {r} runs combined per side: {reg}/{n} = {pct(reg, n)}")
    if args.json:
        args.json.write_text(json.dumps({"rate": rate, "by_example": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
