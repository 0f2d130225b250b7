"""Two gloo ranks of an FSDP2 (``fully_shard``) job under torchrun, with a stopwatch around
FSDP's collectives: each rank writes what each step spent in them to
``stopwatch.rank<N>.json`` in the folder it runs in.

python fsdp_job.py none       # balanced
python fsdp_job.py forward    # rank 1 waits 25 ms in forward
python fsdp_job.py backward   # rank 1 waits 25 ms in backward, between layers' gradients

The slow rank's 25 ms are a wait (a sleep), as a slower device's host thread waits for it: a
spin under load is mostly waiting for a CPU, which the straggler analysis rightly takes off
(tests/cli/ddp_job.py).
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import traceml_ci as traceml

# The DDP example's model: its forward spins forward_ms, its backward backward_ms between the
# first layer's gradient and the later layers' -- as waits (ddp_job.slow_phases_wait).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_job import slow_phases_wait  # noqa: E402
from train_ddp import Net  # noqa: E402  (on sys.path since ddp_job)

#: Past what a loaded runner's contention excuse takes off: on a saturated CPU the slow rank
#: waited 13.7-14.8 ms a step more for a CPU than the other (load 7.5-20), all of it taken off
#: its extra own work (summary/ranks.py), so a 15 ms straggler read as balanced there.
SPIN_MS = 25.0
STEPS = 30


def stopwatched(spent: list[float], orig: Any) -> Any:
    """``orig`` with its time added to ``spent[-1]`` (this step's)."""

    @functools.wraps(orig)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return orig(*args, **kwargs)
        finally:
            spent[-1] += (time.perf_counter() - t0) * 1000.0

    return timed


def main() -> None:
    slow = sys.argv[1]
    slow_phases_wait()
    torch.set_num_threads(1)
    spent: list[float] = [0.0]
    # FSDP2 calls these through ``torch.distributed`` on every use. Wrapped before the process
    # group exists, so the tracer's timing (set once one does) wraps this stopwatch, which
    # wraps the collective.
    for name in ("all_gather_single", "reduce_scatter_single", "all_reduce"):
        setattr(dist, name, stopwatched(spent, getattr(dist, name)))
    traceml.init(run_name="fsdp", warmup_steps=3)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    mine = rank == 1
    model = Net(SPIN_MS if mine and slow == "forward" else 0.0,
                SPIN_MS if mine and slow == "backward" else 0.0)
    for layer in model.body:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randn(16, 1)
    per_step: list[float] = []
    for _ in range(STEPS):
        spent[-1] = 0.0
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
        per_step.append(spent[-1])
    with open(f"stopwatch.rank{rank}.json", "w") as f:
        json.dump({"waited_ms": per_step}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
