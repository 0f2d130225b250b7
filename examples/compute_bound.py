"""A compute-bound CPU training job: a small CNN on in-memory images.

traceml-ci run examples/compute_bound.py          # -> COMPUTE_BOUND
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from training import fit, job_options, repeatable

import traceml_ci as traceml


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def main() -> None:
    parser = job_options(__doc__, steps=100)
    parser.add_argument("--image-size", type=int, default=16)
    args = parser.parse_args()

    repeatable()
    n = args.steps * args.batch_size
    data = TensorDataset(
        torch.randn(n, 3, args.image_size, args.image_size), torch.randint(0, 10, (n,))
    )
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    traceml.init(mode="auto")
    steps, loss = fit(model, loader, optimizer, args.steps)
    print(f"done: {steps} steps, last loss {loss:.3f}")


if __name__ == "__main__":
    main()
