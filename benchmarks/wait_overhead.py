"""What measuring the wait phase costs a DDP step, in-process A/B under torchrun: the same
traced DDP step with the last-ready gradient hooks on and off (tracer/waits.py), in alternating
blocks of steps on every rank, so drift and load hit both sides alike; and the Python bytecodes
a step runs either way (load-independent).

torchrun --nproc-per-node 2 benchmarks/wait_overhead.py [--blocks 40 --steps 50]
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
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import traceml_ci as traceml  # noqa: E402
from benchmarks.bytecodes import count_bytecodes  # noqa: E402
from traceml_ci.tracer import api  # noqa: E402
from traceml_ci.tracer.config import TracerConfig  # noqa: E402

#: Per-step cost from this thread's CPU time: the hooks run on it (CPU autograd), and wall
#: time would count the other rank's lateness and the vCPU's steal.
clock = time.thread_time_ns


def block(model: Any, opt: Any, x: Any, y: Any, n: int) -> float:
    """Microseconds of CPU per traced step, over ``n`` steps."""
    trace_step = traceml.trace_step
    start = clock()
    for _ in range(n):
        with trace_step(model):
            opt.zero_grad(set_to_none=True)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    return (clock() - start) / n / 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tracer = api.start(TracerConfig(out_dir=Path(tmp), warmup_steps=0, module_sample_s=0,
                                        live=False), at_exit=False)
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        model = DistributedDataParallel(net)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = torch.randn(32, 32), torch.randn(32, 1)
        block(model, opt, x, y, 10)  # calibration and warm caches
        probe = tracer.grad_ready
        assert not probe.calibrating and probe.last_ready, "the probe did not settle"
        hooked = len(probe.last_ready)
        on_codes = count_bytecodes(lambda n: block(model, opt, x, y, n), 20, warm=3)
        probe.remove_hooks()
        off_codes = count_bytecodes(lambda n: block(model, opt, x, y, n), 20, warm=3)
        on: list[float] = []
        off: list[float] = []
        for b in range(args.blocks):
            for side in (("on", "off") if b % 2 == 0 else ("off", "on")):
                if side == "on":
                    probe.hook_last_ready()
                    on.append(block(model, opt, x, y, args.steps))
                    probe.remove_hooks()
                else:
                    off.append(block(model, opt, x, y, args.steps))
        tracer.finish()
        api.stop()
        diffs = sorted(a - b for a, b in zip(on, off, strict=True))
        q = statistics.quantiles(diffs, n=4)
        if dist.get_rank() == 0:
            print(f"hooked parameters: {hooked}; Python bytecodes a "
                  f"step: off {off_codes:.0f}  on {on_codes:.0f}  (+{on_codes - off_codes:.0f})")
            print(f"DDP tiny step (rank 0 CPU): off {statistics.median(off):.1f} us  on "
                  f"{statistics.median(on):.1f} us  added {statistics.median(diffs):+.2f} us/step "
                  f"(IQR of pairs {q[0]:+.1f}..{q[2]:+.1f}; {args.blocks} pairs of "
                  f"{args.steps}-step blocks)")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
