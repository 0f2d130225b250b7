"""Wall time of ``traceml-ci diff`` on two summaries, per output format.

    .venv/bin/python benchmarks/gate_latency.py [--runs 15] [BASE HEAD]

Each command runs ``--runs`` times as a fresh process; the minimum is the figure least
disturbed by other load on a shared machine, the median is what a user sees. For reference it
also times a bare ``python -c pass`` and ``traceml-ci --version``. Target: diff <= 0.25 s.

Bytecode: an installed wheel has its .pyc files compiled; a checkout run with
PYTHONDONTWRITEBYTECODE=1 recompiles every module on each start. The script compiles the
package once first (``compileall``) so the figure matches an install.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "gate" / "data"
EXE = str(Path(sys.executable).with_name("traceml-ci"))
TARGET_S = 0.25


def timed(cmd: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system, unaffected by waiting) of each run."""
    wall, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        wall.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("files", nargs="*", default=[str(DATA / "input_bound_a.json"),
                                                 str(DATA / "input_bound_b.json")])
    args = p.parse_args()
    compileall.compile_dir(str(REPO / "traceml_ci"), quiet=1)
    base, head = args.files
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "traceml-ci --version": [EXE, "--version"],
        **{f"diff --format {f}": [EXE, "diff", "--format", f, base, head]
           for f in ("text", "markdown", "json")},
    }
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'command':<24} {'min s':>7} {'median s':>9} {'cpu median s':>13}")
    worst_min = 0.0
    for name, cmd in cases.items():
        times, cpu = timed(cmd, args.runs)
        print(f"{name:<24} {min(times):7.3f} {statistics.median(times):9.3f} "
              f"{statistics.median(cpu):13.3f}")
        if name.startswith("diff"):
            worst_min = max(worst_min, min(times))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"slowest format, best run: {worst_min:.3f} s (target {TARGET_S} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
