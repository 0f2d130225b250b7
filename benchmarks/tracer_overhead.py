"""Tracer overhead, in-process A/B: the same training step with tracing on and off, in
alternating blocks of steps, so drift and noise hit both sides alike.

"off" is the user's plain loop with nothing installed; "on" is the README loop (auto mode:
DataLoader, backward and optimizer patched, forward wrapped per step, trace_step around it).
Reports the median per-step time of each side, the microseconds added and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import traceml_ci as traceml  # noqa: E402
from benchmarks.bytecodes import count_bytecodes  # noqa: E402
from traceml_ci.tracer import api  # noqa: E402
from traceml_ci.tracer.config import TracerConfig  # noqa: E402


def make_job(kind: str) -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(0)
    if kind == "tiny":  # a ~0.5 ms MLP step
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        data = torch.utils.data.TensorDataset(torch.randn(100_000, 32), torch.randn(100_000, 1))
        batch = 32
    else:  # a ~15 ms step
        model = nn.Sequential(
            nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 1)
        )
        data = torch.utils.data.TensorDataset(torch.randn(20_000, 512), torch.randn(20_000, 1))
        batch = 256
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=False)
    return model, optimizer, loader


def endless(loader: Any):
    while True:
        yield from loader


#: Per-step cost is read from this thread's CPU time: on a shared VM, wall time also counts the
#: time the vCPU was taken away (steal), which swamps microsecond effects.
clock = time.thread_time_ns


def mse_step(model: nn.Module, optimizer: Any, x: Any, y: Any) -> None:
    """One training step of the benchmark jobs (the same call in plain and traced blocks, so
    its frame cancels out of the difference)."""
    optimizer.zero_grad(set_to_none=True)
    ((model(x) - y) ** 2).mean().backward()
    optimizer.step()


def plain_block(model, optimizer, batches, n: int) -> float:
    start = clock()
    for _ in range(n):
        x, y = next(batches)
        mse_step(model, optimizer, x, y)
    return (clock() - start) / n / 1000.0


def traced_block(model, optimizer, batches, n: int) -> float:
    trace_step = traceml.trace_step
    start = clock()
    for _ in range(n):
        x, y = next(batches)
        with trace_step(model):
            mse_step(model, optimizer, x, y)
    return (clock() - start) / n / 1000.0


def run(kind: str, blocks: int, block_steps: int, out: Path, late: bool) -> dict[str, float]:
    """Adjacent on/off blocks, order alternating; the added cost is the median of the per-pair
    differences (pairing cancels slow drift), with the interquartile range of those differences.

    ``late``: init() after the optimizer exists (the tracer then also keeps torch's global
    optimizer hooks, for callers that may hold the step from before); else the README order."""
    if late:
        model, optimizer, loader = make_job(kind)
    tracer = api.start(TracerConfig(out_dir=out, warmup_steps=0), at_exit=False)
    if not late:
        model, optimizer, loader = make_job(kind)
    batches = endless(loader)
    tracer.patches.uninstall()
    plain_block(model, optimizer, batches, block_steps)  # warm caches on both paths
    tracer.patches.install()
    traced_block(model, optimizer, batches, block_steps)
    on: list[float] = []
    off: list[float] = []
    for b in range(blocks):
        order = ("on", "off") if b % 2 == 0 else ("off", "on")
        for side in order:
            if side == "on":
                tracer.patches.install()
                on.append(traced_block(model, optimizer, batches, block_steps))
            else:
                tracer.patches.uninstall()
                off.append(plain_block(model, optimizer, batches, block_steps))
    tracer.patches.install()
    tracer.finish()
    api.stop()
    diffs = sorted(a - b for a, b in zip(on, off, strict=True))
    q1, q3 = statistics.quantiles(diffs, n=4)[0], statistics.quantiles(diffs, n=4)[2]
    off_med = statistics.median(off)
    added = statistics.median(diffs)
    return {
        "off": off_med,
        "on": statistics.median(on),
        "added": added,
        "q1": q1,
        "q3": q3,
        "ratio": (off_med + added) / off_med,
    }


def bytecodes_per_step(out: Path, steps: int = 50) -> tuple[float, float]:
    """Python bytecodes run per tiny step, off and on: a load-independent view of the cost
    (``sys.settrace`` opcode events; the tracer's own code is pure Python). Module sampling,
    the live snapshot and the 10 Hz housekeeping are off: they run by the clock, and under
    settrace the clock runs slow, so they would make the count depend on the machine's load."""
    tracer = api.start(
        TracerConfig(out_dir=out, warmup_steps=0, module_sample_s=0, live=False), at_exit=False
    )
    tracer.store.tick_ns = tracer.store._due = 10**18  # housekeeping: never due here
    model, optimizer, loader = make_job("tiny")
    batches = endless(loader)

    def count(block: Any) -> float:
        return count_bytecodes(lambda n: block(model, optimizer, batches, n), steps, warm=5)

    tracer.patches.uninstall()
    off = count(plain_block)
    tracer.patches.install()
    on = count(traced_block)
    tracer.finish()
    api.stop()
    return off, on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=60)
    parser.add_argument("--tiny-steps", type=int, default=200)
    parser.add_argument("--big-steps", type=int, default=10)
    parser.add_argument("--wall", action="store_true", help="wall time instead of CPU time")
    args = parser.parse_args()
    if args.wall:
        global clock
        clock = time.perf_counter_ns
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        off, on = bytecodes_per_step(Path(tmp) / "bytecodes")
        print(f"tiny step, Python bytecodes a step: off {off:.0f}  on {on:.0f}  (+{on - off:.0f})")
        cases = (
            ("tiny", args.tiny_steps, False),
            ("tiny", args.tiny_steps, True),
            ("big", args.big_steps, False),
        )
        for kind, steps, late in cases:
            r = run(kind, args.blocks, steps, Path(tmp) / f"{kind}{late}", late)
            name = f"{kind}{' (init after optimizer)' if late else ''}"
            print(
                f"{name:>28} step: off {r['off']:9.1f} us  on {r['on']:9.1f} us  "
                f"added {r['added']:+7.2f} us/step (IQR of pairs {r['q1']:+.1f}..{r['q3']:+.1f})"
                f"  ratio {r['ratio']:.4f}  ({args.blocks} pairs of {steps}-step blocks)"
            )


if __name__ == "__main__":
    main()
