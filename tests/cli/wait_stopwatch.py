"""Two gloo ranks under torchrun whose waits are known: rank 1 sleeps (an idle wait, not CPU
work) before each step's collective, so rank 0 waits about that long in it. Each rank writes
its own stopwatch of what it waited to ``stopwatch.rank<N>.json`` in the folder it runs in.

python wait_stopwatch.py explicit   # a synchronous dist.all_reduce in the step, stopwatched
python wait_stopwatch.py ddp        # DDP: rank 1 sleeps before backward
python wait_stopwatch.py no_sync    # DDP under no_sync() every step: no all-reduce, no wait
"""

from __future__ import annotations

import contextlib
import json
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import traceml_ci as traceml

SLEEP_MS = 15.0
STEPS = 30


def main() -> None:
    mode = sys.argv[1]
    torch.set_num_threads(1)
    traceml.init(run_name=f"wait-{mode}", warmup_steps=5)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    model = DistributedDataParallel(net) if mode != "explicit" else net
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 64), torch.randn(8, 1)
    waited = []
    for _ in range(STEPS):
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            sync = model.no_sync() if mode == "no_sync" else contextlib.nullcontext()
            with sync:
                loss = ((model(x) - y) ** 2).mean()
                if rank == 1:
                    time.sleep(SLEEP_MS / 1000.0)
                loss.backward()
            if mode == "explicit":
                t = torch.ones(1)
                t0 = time.perf_counter()
                dist.all_reduce(t)
                waited.append((time.perf_counter() - t0) * 1000.0)
            opt.step()
    with open(f"stopwatch.rank{rank}.json", "w") as f:
        json.dump({"waited_ms": waited, "sleep_ms": SLEEP_MS if rank == 1 else 0.0}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
