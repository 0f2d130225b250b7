"""A data-parallel CPU training job (DDP over gloo), optionally with one slow rank.

traceml-ci run --nproc-per-node 2 examples/train_ddp.py                      # RANKS_BALANCED
traceml-ci run --nproc-per-node 2 examples/train_ddp.py --slow-rank 1 --slow data
                                                                   # INPUT_STRAGGLER, rank 1
traceml-ci run --nproc-per-node 2 examples/train_ddp.py --slow-rank 0 --slow forward
                                                                   # COMPUTE_STRAGGLER, rank 0
traceml-ci run --nproc-per-node 2 examples/train_ddp.py --slow-rank 1 --slow backward
                                                        # COMPUTE_STRAGGLER in backward, rank 1
traceml-ci run --nproc-per-node 2 examples/train_ddp.py --slow-rank 1 --slow optimizer
                                                                   # STRAGGLER (optimizer), rank 1
torchrun --nproc-per-node 2 examples/train_ddp.py                 # the same, without our launcher
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import traceml_ci as traceml


def spin(ms: float) -> None:
    """Busy work (not a sleep): a slower host or device computes, it does not idle."""
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


class Samples(Dataset):
    def __init__(self, n: int, delay_ms: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randn(n, 1, generator=g)
        self.delay_ms = delay_ms

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_ms:
            time.sleep(self.delay_ms / 1000.0)  # waiting for storage: an idle wait
        return self.x[i], self.y[i]


class SlowBackward(torch.autograd.Function):
    """Identity forward; its backward spins, between the gradients of the layers after it and
    those of the layers before it (a slower backward kernel, not a slower all-reduce)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ms: float) -> torch.Tensor:
        ctx.ms = ms
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        spin(ctx.ms)
        return grad, None


class Net(nn.Module):
    def __init__(self, forward_ms: float, backward_ms: float = 0.0) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
        self.forward_ms = forward_ms
        self.backward_ms = backward_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.forward_ms:
            spin(self.forward_ms)
        h = self.body[0](x)
        if self.backward_ms:
            h = SlowBackward.apply(h, self.backward_ms)
        return self.body[2](self.body[1](h))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--slow", choices=("data", "forward", "backward", "optimizer"),
                   default="data")
    p.add_argument("--slow-ms", type=float, default=6.0)
    p.add_argument("--no-destroy", action="store_true",
                   help="leave the process group for interpreter exit to clean up")
    p.add_argument("--die-at", type=int, default=None, help="rank --slow-rank exits at this step")
    p.add_argument("--finish-first", action="store_true",
                   help="call traceml.finish() before destroy_process_group, as the README does")
    args = p.parse_args()

    torch.set_num_threads(1)
    traceml.init(run_name="train_ddp", warmup_steps=5)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    slow = rank == args.slow_rank
    data_ms = args.slow_ms if slow and args.slow == "data" else 0.0
    forward_ms = args.slow_ms if slow and args.slow == "forward" else 0.0
    backward_ms = args.slow_ms if slow and args.slow == "backward" else 0.0

    torch.manual_seed(0)
    model = DistributedDataParallel(Net(forward_ms, backward_ms))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if slow and args.slow == "optimizer":  # inside optimizer.step(): a slower update
        opt.register_step_pre_hook(lambda *_: spin(args.slow_ms))
    data = Samples(args.steps * args.batch_size * dist.get_world_size(), data_ms)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data))
    for step, (x, y) in enumerate(loader):
        if slow and args.die_at is not None and step == args.die_at:
            os._exit(3)  # a rank lost mid-run: no cleanup, no summary
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
    if args.finish_first:
        traceml.finish()
    if not args.no_destroy:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
