"""A/B gate runs replayed over several recordings of ``benchmarks/ab_cpu.py`` at once, per kind
of head and per cap: what the table in docs/noise.md ("Twelve rounds, ...") is made of.

    python benchmarks/ab_replay.py [--caps 6,12] KIND=RECORDING.jsonl [KIND=RECORDING.jsonl ...]

e.g. ``aa=/tmp/ab12/aa.jsonl aa=/tmp/abq/aa.jsonl 'fwd20=/tmp/ab12/fwd+20%.jsonl'``. Each
recording is replayed on its own (rounds of two recordings are never mixed in one gate run) and
the verdicts are added up per KIND: back-to-back gate runs as a CI job makes them, and from
every start round with the cap's rounds left (overlapping). To see the rules of another commit,
run this file from a worktree of that commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.ab_cpu import gate_side  # noqa: E402
from benchmarks.gate_common import ab_gate_runs  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--caps", default="6,12", help="the gate runs' caps, comma-separated")
    p.add_argument("recordings", nargs="+", metavar="KIND=RECORDING")
    args = p.parse_args()
    from traceml_ci.gate.ab.sequential import AbSettings, RoundPair

    kinds: dict[str, list[list[RoundPair]]] = {}
    for spec in args.recordings:
        kind, _, path = spec.partition("=")
        recs = [json.loads(line) for line in Path(path).read_text().splitlines()]
        kinds.setdefault(kind, []).append(
            [RoundPair(i + 1, gate_side(r["base"]), gate_side(r["head"]))
             for i, r in enumerate(recs)])
    for kind, recordings in kinds.items():
        rounds = sum(len(r) for r in recordings)
        print(f"{kind}: {len(recordings)} recording(s), {rounds} rounds")
        for cap in (int(c) for c in args.caps.split(",")):
            for every in (False, True):
                verdicts: Counter[str] = Counter()
                moved: Counter[str] = Counter()
                taken = []
                for pairs in recordings:
                    for result, n in ab_gate_runs(pairs, AbSettings(max_rounds=cap), every):
                        verdicts[result.verdict.value if result.verdict else "undecided"] += 1
                        moved.update(iv.metric for iv in result.regressed)
                        taken.append(n)
                how = "from every start" if every else "back to back"
                print(f"  cap {cap:2}, {how:16}: {dict(verdicts)}; regressed {dict(moved)}; "
                      f"mean rounds {statistics.mean(taken):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
