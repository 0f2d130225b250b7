"""False alarms of the pytest plugin: an unchanged tiny smoke test (~3 ms step), gated N times
in a folder with heavy tests before and after it (200 MB kept, a CPU-heavy loop), against a
baseline recorded once. Optionally two CPU hogs run beside every other gated session (the worst
case: a quiet baseline, a loaded head).

    .venv/bin/python benchmarks/plugin_false_alarms.py [--runs 20] [--hogs] [--confirm 2]

Prints, per session: the verdict and how many runs the tiny job cost (1 on a clean result;
up to 1 + confirm when a result that regressed or came close was confirmed); then the failure
count (target: 0 of 20), the warnings and what warned (target: at most 2 of 20), and the mean
runs per job (target: 1 on an unchanged PR).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TRAIN = '''
import torch
from torch import nn

import traceml_ci as traceml

torch.set_num_threads(1)


def train(steps=60):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 384), nn.ReLU(), nn.Linear(384, 384), nn.ReLU(),
                          nn.Linear(384, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(192, 128), torch.randn(192, 1)) for _ in range(steps)]
    for x, y in data:
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
'''

TINY = '''
import pytest

from tiny_train import train


@pytest.mark.traceml(warmup_steps=5, key="tiny")
def test_tiny_smoke():
    train()
'''

HEAVY = '''
import torch

KEPT = []


def test_memory_heavy():
    KEPT.append(bytearray(b"x") * (200 * 1024 * 1024))  # kept: the process's RSS stays up


def test_cpu_heavy():
    a = torch.randn(512, 512)
    for _ in range(200):
        a = torch.tanh(a @ a.T / 512)
'''


def _hog(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def _session(folder: Path, *args: str) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           f"--traceml-baseline={folder / 'baseline.json'}", *args]
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hogs", action="store_true",
                        help="two CPU hogs beside every other gated session")
    parser.add_argument("--confirm", type=int, default=None,
                        help="--traceml-confirm for the gated sessions (default: the plugin's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="plugin-false-alarms-") as tmp:
        folder = Path(tmp)
        (folder / "tiny_train.py").write_text(textwrap.dedent(TRAIN))
        (folder / "test_a_heavy.py").write_text(textwrap.dedent(HEAVY))
        (folder / "test_tiny.py").write_text(textwrap.dedent(TINY))
        (folder / "test_z_heavy.py").write_text(textwrap.dedent(HEAVY))
        code, out = _session(folder, "--traceml-update-baseline")
        if code != 0:
            sys.exit(f"recording the baseline failed (exit {code}):\n{out}")
        base = json.loads((folder / "baseline.json").read_text())["summaries"]["tiny"]
        print(f"baseline: step {base['step_time']['step_ms']['median']:.2f} ms")
        extra = [] if args.confirm is None else [f"--traceml-confirm={args.confirm}"]
        failures, warns, runs = 0, 0, []
        for i in range(args.runs):
            loaded = args.hogs and i % 2 == 1
            hogs = []
            if loaded:
                stop_at = time.time() + 600
                hogs = [multiprocessing.Process(target=_hog, args=(stop_at,), daemon=True)
                        for _ in range(2)]
                for h in hogs:
                    h.start()
            try:
                save = folder / "head.json"
                code, out = _session(folder, f"--traceml-save={save}",
                                     f"--traceml-comparison={folder / 'comparison.json'}",
                                     *extra)
            finally:
                for h in hogs:
                    h.terminate()
                    h.join()
            comparison = json.loads((folder / "comparison.json").read_text())
            verdict = comparison["verdict"]
            warned = [f"{r['name']} ({r['delta']:+.1f}{'pp' if r['delta_unit'] == 'pp' else '%'})"
                      for item in comparison.get("items", {}).values()
                      for r in item["rows"] if r["status"] == "warn" and r["delta"] is not None]
            warns += verdict == "warn"
            head = json.loads(save.read_text())["summaries"]["tiny"]
            n = (head.get("repeats") or {}).get("count", 1)
            runs.append(n)
            failures += code == 1
            print(f"session {i + 1}{' (2 hogs)' if loaded else ''}: exit {code}, verdict "
                  f"{verdict}, {n} run(s), step {head['step_time']['step_ms']['median']:.2f} ms"
                  + (f"; warned: {', '.join(warned)}" if warned else ""))
        print(f"failures: {failures} of {args.runs}; warnings: {warns} of {args.runs}; "
              f"mean runs per job "
              f"{statistics.fmean(runs):.2f} (max {max(runs)})")


if __name__ == "__main__":
    main()
