"""An input-bound CPU training job: the dataset is slow, the model is tiny.

traceml-ci run examples/input_bound.py            # -> INPUT_BOUND
python examples/input_bound.py --sample-ms 0      # a fast dataset instead
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import traceml_ci as traceml


class SlowDataset(Dataset):
    """Each sample costs ``sample_ms`` of "decoding" (a sleep), like a JPEG pipeline would."""

    def __init__(self, n: int, sample_ms: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.sample_s = sample_ms / 1000.0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sample_s:
            time.sleep(self.sample_s)
        return self.x[i], self.y[i]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sample-ms", type=float, default=0.25)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = nn.CrossEntropyLoss()
    loader = DataLoader(
        SlowDataset(args.steps * args.batch_size, args.sample_ms),
        batch_size=args.batch_size,
        shuffle=True,
    )

    traceml.init(mode="auto")
    for step, (x, y) in enumerate(loader):
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        if step + 1 >= args.steps:
            break
    print(f"done: {step + 1} steps, last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
