"""False alarms: run the same example job many times and diff pairs of runs, with CPU hogs
beside half of them (the worst case: a quiet base, a loaded head).

    .venv/bin/python benchmarks/gate_false_alarms.py [--runs 20] [--hogs 2] [--repeats 3 5]
        [--keep DIR] [EXAMPLE ...]

Nothing changed between runs, so every ``regression`` verdict is a false alarm (exit 1 in CI).
Of ``--runs`` runs per example, the first half run quiet and the second half with ``--hogs``
busy-loop processes beside them (``--hogs 0``: all quiet). Judged, at the default rules:

- quiet: every ordered pair of distinct quiet runs;
- loaded head: every quiet base against every loaded head;
- all: every ordered pair of distinct runs.

Target: at most 1 % in each. Warnings (exit 0) are reported too, as is the rate with the noise
rule off and with the contention guard off, to show what each buys. Each run's measured
runqueue wait (``run.contention``) is summarised per group. ``--keep DIR`` keeps the
summaries and reuses any already there, so a second run only re-judges. ``--repeats R`` also
judges disjoint R-run combinations (``traceml-ci combine``) of the quiet runs against each
other, and of quiet bases against loaded heads. "plugin policy" is what the pytest plugin
does by default: a baseline of 3 quiet runs combined, the head's first run judged and re-run
(up to 2 more) while it regresses or comes close -- with its runs per job (the CI cost).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_common import (  # noqa: E402
    REPO,
    judge_combined,
    judge_pairs,
    judge_sequential,
    pct,
    run_many,
    runqueue_waits,
)

TARGET = 0.01


def _without_contention(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same summaries with their contention measurement removed (the guard then sleeps)."""
    out = []
    for d in docs:
        run = {k: v for k, v in d["run"].items() if k != "contention"}
        out.append({**d, "run": run})
    return out


def _line(what: str, res: dict[str, Any]) -> tuple[int, int]:
    n, reg = res["pairs"], res["verdicts"].get("regression", 0)
    warn = res["verdicts"].get("warn", 0)
    cost = f", {res['runs_per_job']:.2f} runs per job" if "runs_per_job" in res else ""
    print(f"  {what}: regression (false alarm) {reg}/{n} = {pct(reg, n)}, warn {pct(warn, n)}"
          f"{cost}")
    if res["regressed"]:
        print(f"    metrics that regressed: {res['regressed']}")
    return reg, n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("examples", nargs="*", default=["input_bound", "compute_bound"])
    p.add_argument("--runs", type=int, default=20, help="runs per example (half of them loaded)")
    p.add_argument("--hogs", type=int, default=2,
                   help="CPU hogs beside the second half of the runs (0: all quiet)")
    p.add_argument("--keep", type=Path, help="folder for the summaries (reused when present)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--repeats", type=int, nargs="*", default=[3],
                   help="also judge combined summaries of this many runs per side (disjoint "
                   "groups of the same runs; default 3)")
    args = p.parse_args()

    from traceml_ci.gate import DEFAULT_RULES

    root = args.keep or Path(tempfile.mkdtemp(prefix="gate-fa-"))
    no_noise = DEFAULT_RULES.with_tolerances({}, noise_factor=0.0, source="noise rule off")
    results: dict[str, Any] = {}
    totals: dict[str, list[int]] = {}
    n_loaded = args.runs // 2 if args.hogs else 0
    n_quiet = args.runs - n_loaded
    for name in args.examples:
        script = REPO / "examples" / f"{name}.py"
        quiet = run_many(script, root / name / "quiet", n_quiet, label=f"{name} quiet")
        loaded = run_many(script, root / name / f"hogs{args.hogs}", n_loaded,
                          label=f"{name} +{args.hogs} hogs", hogs=args.hogs)
        labels = sorted({d["step_time"]["diagnosis"] for d in quiet + loaded})
        print(f"\n{name}: {n_quiet} quiet runs (runqueue wait {runqueue_waits(quiet)}), "
              f"{n_loaded} beside {args.hogs} hogs (runqueue wait {runqueue_waits(loaded)}); "
              f"labels {labels}")
        groups: dict[str, dict[str, Any]] = {"quiet": judge_pairs(quiet)}
        if loaded:
            groups["loaded head"] = judge_pairs(quiet, loaded)
            groups["loaded head, contention guard off"] = judge_pairs(
                quiet, _without_contention(loaded))
            groups["all"] = judge_pairs(quiet + loaded)
        groups["quiet, noise rule off"] = judge_pairs(quiet, rules=no_noise)
        # The pytest plugin's policy: a 3-run baseline, the head re-run when it comes close.
        groups["quiet, plugin policy"] = judge_sequential(quiet, None)
        if loaded:
            groups["loaded head, plugin policy"] = judge_sequential(quiet, loaded)
        for r in args.repeats:
            if 2 * r <= len(quiet):
                groups[f"quiet, {r} runs combined per side"] = judge_combined(quiet, None, r)
            if r <= len(quiet) and r <= len(loaded):
                groups[f"loaded head, {r} runs combined per side"] = judge_combined(
                    quiet, loaded, r)
        results[name] = {"quiet_runs": n_quiet, "loaded_runs": n_loaded, "labels": labels,
                         "runqueue_wait": {"quiet": runqueue_waits(quiet),
                                           "loaded": runqueue_waits(loaded)},
                         **groups}
        for what, res in groups.items():
            reg, n = _line(what, res)
            acc = totals.setdefault(what, [0, 0])
            acc[0] += reg
            acc[1] += n
    print()
    for what, (reg, n) in totals.items():
        mark = "" if "off" in what else (" ok" if n and reg / n <= TARGET else " ABOVE TARGET")
        print(f"false-alarm rate, {what}: {reg}/{n} = {pct(reg, n)}"
              f" (target <= {100 * TARGET:.0f}%){mark}")
    print(f"summaries in {root}")
    if args.json:
        args.json.write_text(json.dumps({"totals": totals, "by_example": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

