"""Wall time of the example smoke-test session (examples/smoke_tests: three CPU training jobs,
gated by the plugin on the committed baseline).

    .venv/bin/python benchmarks/plugin_smoke_session.py [--runs 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    walls = []
    for i in range(args.runs):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "examples/smoke_tests", "-p", "no:cacheprovider",
             "--durations=0", "-q"],
            cwd=ROOT, capture_output=True, text=True,
        )
        wall = time.perf_counter() - t0
        walls.append(wall)
        calls = re.findall(r"^([\d.]+)s (call|setup) +(\S+)", out.stdout, re.M)
        verdicts = re.findall(r"^(PASS|WARN|REGRESSION|NO BASELINE)\s+(\S+)", out.stdout, re.M)
        print(f"run {i + 1}: {wall:.1f} s wall, exit {out.returncode}; "
              + ", ".join(f"{name.split('::')[-1]} {s}s" for s, kind, name in calls
                          if kind == "call")
              + "; " + ", ".join(v for v, _ in verdicts))
    print(f"median wall time: {statistics.median(walls):.1f} s over {args.runs} runs")


if __name__ == "__main__":
    main()
