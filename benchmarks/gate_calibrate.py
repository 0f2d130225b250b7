"""Re-judge the summaries kept by gate_false_alarms.py and gate_detection.py under rule variants.

    .venv/bin/python benchmarks/gate_calibrate.py --fa DIR --det DIR

No job runs: it loads ``DIR/<example>/run-*/final_summary.json`` (false alarms) and
``DIR/base``, ``DIR/<phase>+<N>pp`` (detection), and prints, per variant of the noise rule and
noise factor, the false-alarm rate over every ordered pair of unchanged runs and the detection
rate per injected shift. This is how the defaults in docs/gate.md were chosen.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_common import judge_pairs  # noqa: E402


def load(folder: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(folder.glob("run-*/final_summary.json"))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fa", type=Path, required=True)
    p.add_argument("--det", type=Path, required=True)
    p.add_argument("--factors", default="0.5,1,1.5,2,3")
    p.add_argument("--pct-abs", default="5", help="fail tiers (pp) to try for *_pct")
    p.add_argument("--rules", default="beyond,margin", help="noise rules to try")
    args = p.parse_args()

    from traceml_ci.gate import DEFAULT_RULES

    fa_sets = {d.name: load(d) for d in sorted(args.fa.iterdir()) if d.is_dir()}
    bases = load(args.det / "base")
    heads = {d.name: load(d) for d in sorted(args.det.iterdir())
             if d.is_dir() and d.name != "base"}
    fa_sets["gate_job"] = bases
    shifts = sorted(heads, key=lambda n: (n.split("+")[0], float(n.split("+")[1][:-2])))
    print(f"{'variant':<18} {'false alarms':>13}  " + "  ".join(f"{s:>14}" for s in shifts))
    variants = [(r, float(f), float(a)) for r in args.rules.split(",")
                for f in args.factors.split(",") for a in args.pct_abs.split(",")]
    for rule, factor, pct_abs in variants:
        if True:
            base_rules = DEFAULT_RULES.with_tolerances(
                {"step_time.*_pct": {"abs": pct_abs, "warn_abs": min(3.0, pct_abs)}})
            rules = dataclasses.replace(base_rules, noise_rule=rule, noise_factor=factor,
                                        _cache={})
            fa_n = fa_bad = 0
            for docs in fa_sets.values():
                res = judge_pairs(docs, rules=rules)
                fa_n += res["pairs"]
                fa_bad += res["verdicts"].get("regression", 0)
            det = []
            for s in shifts:
                res = judge_pairs(bases, heads[s], rules=rules)
                det.append(100.0 * res["verdicts"].get("regression", 0) / res["pairs"])
            name = f"{rule} x{factor:g} {pct_abs:g}pp"
            print(f"{name:<18} {100.0 * fa_bad / fa_n:>12.2f}%  "
                  + "  ".join(f"{x:>13.1f}%" for x in det))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
