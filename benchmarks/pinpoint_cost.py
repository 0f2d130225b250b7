"""What pinpointing costs (docs/pinpoint.md), side by side in one process:

1. Module sampling, A/B: the same traced loop in alternating blocks with module sampling on
   (its default period) and off. Each block lasts a few sample periods, so the "on" blocks
   carry their share of samples; the added cost per step is the median of the pair differences.
   Block-to-block noise is larger than the effect, so the cost of one sample is also measured
   directly (pairs of steps, one of them sampled) and amortised over the default period
   (one sample per period: cost / steps per period, where a step longer than the period is
   sampled every time).
2. The FLOP-count step: the first trace_step (a warmup step) runs under FlopCounterMode; its
   time against the next warmup step and the median step.
3. The summary's size with ``modules`` and ``efficiency``.

Per-step times are this thread's CPU time (a shared VM's steal would swamp microseconds).
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
from traceml_ci.tracer import api  # noqa: E402
from traceml_ci.tracer.config import TracerConfig  # noqa: E402
from traceml_ci.tracer.modules import SAMPLE_EVERY_S, select_modules  # noqa: E402

clock = time.thread_time_ns


def make_model(kind: str) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    if kind == "tiny":  # 3 timed modules, a ~0.2 ms step
        return (nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)),
                (torch.randn(32, 32), torch.randn(32, 1)))
    if kind == "tiny32":  # 32 timed modules (8 blocks of 3 + their parents), still small
        blocks = [nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
                  for _ in range(8)]
        return (nn.Sequential(*blocks, nn.Linear(32, 1)),
                (torch.randn(32, 32), torch.randn(32, 1)))
    if kind == "transformer":  # a small encoder: attention, layer norms, ~10 ms step
        layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256,
                                           batch_first=True)
        model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=4), nn.Flatten(),
                              nn.Linear(128 * 32, 1))
        return model, (torch.randn(16, 32, 128), torch.randn(16, 1))
    # "big": a ~15 ms MLP step
    return (nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                          nn.Linear(512, 1)),
            (torch.randn(256, 512), torch.randn(256, 1)))


def steps(model: nn.Module, opt: Any, batch: Any, n: int) -> float:
    """n traced steps; this thread's CPU µs per step."""
    x, y = batch
    trace_step = traceml.trace_step
    t0 = clock()
    for _ in range(n):
        with trace_step(model):
            opt.zero_grad(set_to_none=True)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    return (clock() - t0) / n / 1000.0


def per_sample_cost(model: nn.Module, opt: Any, batch: Any, sampler: Any, pairs: int
                    ) -> tuple[float, float]:
    """CPU µs one sample adds: pairs of steps, one armed by hand just before it (the arming,
    the hooks, resolving it at the next tick), one plain; median and IQR of the differences."""
    sampler.every_ns = 0
    sampler.enabled = False
    steps(model, opt, batch, 1)  # a sample armed by the A/B blocks runs out here
    diffs = []
    for p in range(pairs):
        for side in ("sampled", "plain") if p % 2 == 0 else ("plain", "sampled"):
            t0 = clock()
            if side == "sampled":
                sampler.enabled = True
                sampler.tick(time.perf_counter_ns())  # arm now, and resolve the last sample
                sampler.enabled = False
            steps(model, opt, batch, 1)
            took = (clock() - t0) / 1000.0
            if side == "sampled":
                sampled = took
            else:
                plain = took
        diffs.append(sampled - plain)
    diffs.sort()
    q = statistics.quantiles(diffs, n=4)
    return statistics.median(diffs), q[2] - q[0]


def module_sampling(kind: str, pairs: int, block_s: float, out: Path) -> dict[str, float]:
    model, batch = make_model(kind)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracer = api.start(TracerConfig(out_dir=out, warmup_steps=2, live=False), at_exit=False)
    sampler = tracer.module_sampler
    steps(model, opt, batch, 50)
    per_step_us = steps(model, opt, batch, 200)
    n = max(20, int(block_s * 1e6 / per_step_us))
    on: list[float] = []
    off: list[float] = []
    for p in range(pairs):
        for side in ("on", "off") if p % 2 == 0 else ("off", "on"):
            sampler.enabled = side == "on"
            (on if side == "on" else off).append(steps(model, opt, batch, n))
    direct_pairs = max(40, min(2000, int(20e6 / per_step_us)))
    per_sample, per_sample_iqr = per_sample_cost(model, opt, batch, sampler, direct_pairs)
    sampler.enabled = True
    path = tracer.finish()
    api.stop()
    off_med = statistics.median(off)
    ab = sorted(a - b for a, b in zip(on, off, strict=True))
    q = statistics.quantiles(ab, n=4)
    steps_per_period = SAMPLE_EVERY_S * 1e6 / off_med
    return {
        "modules": len(select_modules(model)),
        "off_us": off_med,
        "ab_added_us": statistics.median(ab),
        "ab_q1": q[0],
        "ab_q3": q[2],
        "per_sample_us": per_sample,
        "per_sample_iqr": per_sample_iqr,
        "amortised_us": per_sample / max(steps_per_period, 1.0),
        "block_steps": n,
        "summary_bytes": path.stat().st_size if path else -1,
    }


def flop_count_step(kind: str, out: Path) -> dict[str, float]:
    model, batch = make_model(kind)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracer = api.start(TracerConfig(out_dir=out, warmup_steps=3, live=False), at_exit=False)
    times = [steps(model, opt, batch, 1) for _ in range(60)]
    path = tracer.finish()
    api.stop()
    import json

    eff = json.loads(path.read_text()).get("efficiency") or {}
    return {"counted_ms": times[0] / 1000, "second_ms": times[1] / 1000,
            "median_ms": statistics.median(times[3:]) / 1000,
            "gflop": (eff.get("flops_per_step") or 0) / 1e9,
            "gflops_s": (eff.get("achieved_tflops") or 0) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--block-s", type=float, default=2.0,
                        help="seconds per block (several default sample periods)")
    parser.add_argument("--kinds", default="tiny,tiny32,transformer,big")
    args = parser.parse_args()
    torch.set_num_threads(1)
    kinds = args.kinds.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        print(f"module sampling (default period {SAMPLE_EVERY_S} s), CPU µs per step:")
        for kind in kinds:
            r = module_sampling(kind, args.pairs, args.block_s, Path(tmp) / f"m-{kind}")
            print(f"  {kind:>11}: {r['modules']:2d} modules, step {r['off_us']:8.1f} µs | A/B "
                  f"added {r['ab_added_us']:+6.2f} µs/step "
                  f"(IQR {r['ab_q1']:+.2f}..{r['ab_q3']:+.2f})"
                  f" | one sample {r['per_sample_us']:7.1f} µs (IQR {r['per_sample_iqr']:.1f}) "
                  f"-> amortised "
                  f"{r['amortised_us']:.3f} µs/step | summary {r['summary_bytes']} B")
        print("FLOP count (first trace_step, a warmup step):")
        for kind in kinds:
            r = flop_count_step(kind, Path(tmp) / f"f-{kind}")
            print(f"  {kind:>11}: counted step {r['counted_ms']:7.2f} ms, next warmup step "
                  f"{r['second_ms']:6.2f} ms, median step {r['median_ms']:6.2f} ms | "
                  f"{r['gflop']:.4f} GFLOP/step, {r['gflops_s']:.1f} GFLOP/s achieved")


if __name__ == "__main__":
    main()
