"""Fixed cost of the launcher: `traceml-ci run script.py` vs `python script.py`, alternated.

The script is a short CPU training job (examples/zero_change.py by default); both sides import
torch, so the difference is the launcher process, the tracer's setup and writing the summary.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def wall(cmd: list[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("script", nargs="?", default=str(REPO / "examples" / "zero_change.py"))
    args = parser.parse_args()
    cli = str(Path(sys.executable).with_name("traceml-ci"))
    cli_cmd = [cli] if os.path.exists(cli) else [sys.executable, "-m", "traceml_ci"]
    plain, traced = [], []
    with tempfile.TemporaryDirectory() as tmp:
        wall([sys.executable, args.script], tmp)  # warm the page cache for both sides
        for i in range(args.repeats):
            pair = [
                ("plain", [sys.executable, args.script]),
                ("traced", [*cli_cmd, "run", "--out", tmp, args.script]),
            ]
            if i % 2:
                pair.reverse()
            for side, cmd in pair:
                (plain if side == "plain" else traced).append(wall(cmd, tmp))
    p, t = statistics.median(plain), statistics.median(traced)
    print(f"python script.py          median {p:6.2f} s  ({args.repeats} runs)")
    print(f"traceml-ci run script.py  median {t:6.2f} s  ({args.repeats} runs)")
    print(f"added: {t - p:+.2f} s (target <= 0.5 s)")


if __name__ == "__main__":
    main()
