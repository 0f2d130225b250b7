"""Shared by the gate benchmarks: run a job under ``traceml-ci run`` and load the summaries."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("traceml-ci"))


def run_job(script: Path, out: Path, args: Sequence[str] = ()) -> dict[str, Any]:
    """Run ``script`` traced into ``out`` (reused if a summary is already there)."""
    summary = out / "final_summary.json"
    if not summary.exists():
        subprocess.run([EXE, "run", "--out", str(out), str(script), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(summary.read_text())


def run_many(script: Path, root: Path, n: int, args: Sequence[str] = (),
             label: str = "") -> list[dict[str, Any]]:
    docs = []
    t0 = time.perf_counter()
    for i in range(n):
        docs.append(run_job(script, root / f"run-{i:02d}", args))
        print(f"  {label or script.stem}: {i + 1}/{n} runs ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    return docs


def judge_pairs(bases: Sequence[dict[str, Any]], heads: Sequence[dict[str, Any]] | None = None,
                rules: Any = None) -> dict[str, Any]:
    """Compare every (base, head) pair: ordered pairs of distinct runs when ``heads`` is None.
    Returns verdict counts and which metrics drove regressions and warnings."""
    from traceml_ci.gate import DEFAULT_RULES, Status, compare

    rules = rules or DEFAULT_RULES
    if heads is None:
        pairs = list(itertools.permutations(bases, 2))
    else:
        pairs = list(itertools.product(bases, heads))
    verdicts: Counter[str] = Counter()
    regressed: Counter[str] = Counter()
    warned: Counter[str] = Counter()
    for b, h in pairs:
        c = compare(b, h, rules)
        verdicts[c.verdict.value] += 1
        for r in c.rows:
            if r.status is Status.REGRESSED:
                regressed[r.name] += 1
            elif r.status is Status.WARN:
                warned[r.name] += 1
    return {"pairs": len(pairs), "verdicts": dict(verdicts), "regressed": dict(regressed),
            "warned": dict(warned)}


def pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "n/a"
