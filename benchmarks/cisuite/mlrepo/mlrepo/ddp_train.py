"""Data-parallel training of the MLP regressor on CPU (gloo), with gradient accumulation.

    torchrun --nproc-per-node 2 mlrepo/ddp_train.py --steps 20
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from mlrepo.models import MLP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--accum-steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    n = args.steps * args.accum_steps * args.batch_size * dist.get_world_size()
    x = torch.randn(n, 64)
    y = torch.tanh(x.sum(1, keepdim=True) / 8)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = DDP(MLP(features=64, hidden=256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for micro, (inputs, targets) in enumerate(loader):
        sync = (micro + 1) % args.accum_steps == 0
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = F.mse_loss(model(inputs), targets) / args.accum_steps
            loss.backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
