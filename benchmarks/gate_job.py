"""A small CPU training job with knobs to inject real slowdowns, for the gate benchmarks.

    traceml-ci run benchmarks/gate_job.py [--dataset-ms X] [--forward-ms Y] [--steps N]
                                          [--fixed-work] [--io-ms Z]

Each batch costs ``--base-dataset-ms`` of busy work in the dataset (plus ``--dataset-ms``
injected), the model is a real MLP (plus ``--forward-ms`` of busy work in its forward).
Busy work spins on the wall clock by default, so a loaded machine does less of it;
``--fixed-work`` makes each "ms" a fixed number of loop iterations (``WORK_PER_MS``, about a
millisecond on an idle runner) -- the same work however loaded, as a real code change is.
``--io-ms`` makes each batch also wait that long off the CPU (a sleep: a read from disk).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import traceml_ci as traceml

#: Loop iterations of ``work`` per "ms" with --fixed-work (~1 ms idle, on the 2-core VM).
WORK_PER_MS = 20_000
FIXED_WORK = False


def work(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i
    return total


def busy(ms: float) -> None:
    if FIXED_WORK:
        work(int(ms * WORK_PER_MS))
        return
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


class Batches(Dataset):
    """Whole batches (the DataLoader does not batch): ``ms`` of decoding work per batch."""

    def __init__(self, n: int, batch: int, ms: float, io_ms: float = 0.0) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, batch, 128, generator=g)
        self.y = torch.randint(0, 10, (n, batch), generator=g)
        self.ms = ms
        self.io_s = io_ms / 1000.0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        busy(self.ms)
        if self.io_s:
            time.sleep(self.io_s)
        return self.x[i], self.y[i]


class Model(nn.Module):
    def __init__(self, extra_ms: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                 nn.Linear(512, 10))
        self.extra_ms = extra_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra_ms:
            busy(self.extra_ms)
        return self.net(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=160)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--base-dataset-ms", type=float, default=1.5)
    p.add_argument("--dataset-ms", type=float, default=0.0, help="injected, ms per batch")
    p.add_argument("--forward-ms", type=float, default=0.0, help="injected, ms per forward")
    p.add_argument("--io-ms", type=float, default=0.0, help="injected, ms asleep per batch")
    p.add_argument("--fixed-work", action="store_true",
                   help="busy work is a fixed iteration count, not a wall-clock spin")
    args = p.parse_args()
    global FIXED_WORK
    FIXED_WORK = args.fixed_work
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Model(args.forward_ms)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    data = Batches(args.steps, args.batch_size, args.base_dataset_ms + args.dataset_ms,
                   args.io_ms)
    loader = DataLoader(data, batch_size=None, shuffle=False)
    traceml.init(mode="auto")
    for x, y in loader:
        with traceml.trace_step(model):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
