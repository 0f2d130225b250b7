"""Live snapshot overhead, in-process A/B: the same traced ~1 ms CPU step with the snapshot
writer thread on and off, in alternating blocks, so drift and noise hit both sides alike.

Both sides are traced (README loop, auto mode); only the writer differs. A block lasts a few
snapshot intervals, so the "on" side holds several snapshots. Per side: the median, mean and
p99 wall time of a step (the writer costs the loop only by holding the GIL, which the median
of steps mostly hides and the mean and tail show), and the ratio of the means. Then the
writer's own cost: one snapshot (build + write) timed in this thread, and the writer thread's
CPU time over the "on" blocks as a share of one core.
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
from benchmarks.tracer_overhead import endless, mse_step  # noqa: E402
from traceml_ci.summary.live import SNAPSHOT_INTERVAL_S  # noqa: E402
from traceml_ci.tracer import api  # noqa: E402
from traceml_ci.tracer.config import TracerConfig  # noqa: E402


def make_job() -> tuple[nn.Module, Any, Any]:
    """A ~1 ms CPU step on one thread (MLP, batch 64)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 384), nn.ReLU(), nn.Linear(384, 384), nn.ReLU(),
                          nn.Linear(384, 1))
    data = torch.utils.data.TensorDataset(torch.randn(20_000, 128), torch.randn(20_000, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=False)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), loader


def block(model: nn.Module, optimizer: Any, batches: Any, seconds: float) -> list[float]:
    """Traced steps for ``seconds``; each step's wall time in ms."""
    trace_step = traceml.trace_step
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter_ns()
        x, y = next(batches)
        with trace_step(model):
            mse_step(model, optimizer, x, y)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return times


def thread_cpu_s(thread: Any) -> float:
    """CPU seconds a thread has used (Linux: its own CPU clock)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError, TypeError):  # not Linux, or the thread is gone
        return float("nan")


def stats(times: list[float]) -> dict[str, float]:
    s = sorted(times)
    return {"median": statistics.median(s), "mean": statistics.fmean(s),
            "p99": s[min(len(s) - 1, int(0.99 * len(s)))], "steps": len(s)}


def run(blocks: int, block_s: float, interval_s: float, snapshots: int, out: Path) -> None:
    tracer = api.start(TracerConfig(out_dir=out, warmup_steps=5, live=False), at_exit=False)
    model, optimizer, loader = make_job()
    batches = endless(loader)
    block(model, optimizer, batches, min(block_s, 1.0))  # warm caches; fills a first window
    on: list[float] = []
    off: list[float] = []
    writer_cpu = writer_wall = 0.0
    for b in range(blocks):
        for side in (("on", "off") if b % 2 == 0 else ("off", "on")):
            if side == "off":
                off += block(model, optimizer, batches, block_s)
                continue
            writer = tracer.live_writer(interval_s).start()
            started, cpu0 = time.perf_counter(), thread_cpu_s(writer._thread)
            on += block(model, optimizer, batches, block_s)
            writer_cpu += thread_cpu_s(writer._thread) - cpu0
            writer_wall += time.perf_counter() - started
            writer.stop()

    # The writer's own cost, alone: build a snapshot, then write it.
    writer = tracer.live_writer(interval_s)
    build, write = [], []
    for _ in range(snapshots):
        t0 = time.perf_counter_ns()
        doc = writer.snapshot()
        t1 = time.perf_counter_ns()
        writer._write(doc)
        t2 = time.perf_counter_ns()
        build.append((t1 - t0) / 1e6)
        write.append((t2 - t1) / 1e6)
    tracer.finish()
    api.stop()

    a, b_ = stats(on), stats(off)
    print(f"step (ms)        median    mean     p99   steps   ({blocks} pairs of {block_s:g} s "
          f"blocks, a snapshot every {interval_s:g} s)")
    for name, s in (("writer on", a), ("writer off", b_)):
        print(f"  {name:<12} {s['median']:8.4f} {s['mean']:7.4f} {s['p99']:7.3f} {s['steps']:7d}")
    print(f"  ratio on/off: median {a['median'] / b_['median']:.4f}  "
          f"mean {a['mean'] / b_['mean']:.4f}")
    print(f"snapshot (ms, alone): build median {statistics.median(build):.3f}  "
          f"write median {statistics.median(write):.3f}  ({snapshots} snapshots)")
    if writer_wall > 0:
        print(f"writer thread CPU while on: {100 * writer_cpu / writer_wall:.2f} % of one core")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=20, help="pairs of on/off blocks")
    parser.add_argument("--block-s", type=float, default=3.0, help="seconds per block")
    parser.add_argument("--interval", type=float, default=SNAPSHOT_INTERVAL_S,
                        help="seconds between snapshots")
    parser.add_argument("--snapshots", type=int, default=200,
                        help="snapshots timed alone, for the writer's own cost")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        run(args.blocks, args.block_s, args.interval, args.snapshots, Path(tmp))


if __name__ == "__main__":
    main()
