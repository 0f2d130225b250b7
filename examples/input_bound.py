"""An input-bound CPU training job: the dataset is slow, the model is tiny.

traceml-ci run examples/input_bound.py            # -> INPUT_BOUND
python examples/input_bound.py --sample-ms 0      # a fast dataset instead
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader
from training import Decoded, fit, job_options, repeatable

import traceml_ci as traceml


def main() -> None:
    parser = job_options(__doc__, steps=150)
    parser.add_argument("--sample-ms", type=float, default=0.25)
    args = parser.parse_args()

    repeatable()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    # Each sample "decodes" for --sample-ms asleep, like a JPEG pipeline waiting on storage.
    loader = DataLoader(
        Decoded(args.steps * args.batch_size, (64,), args.sample_ms),
        batch_size=args.batch_size,
        shuffle=True,
    )

    traceml.init(mode="auto")
    steps, loss = fit(model, loader, optimizer, args.steps)
    print(f"done: {steps} steps, last loss {loss:.3f}")


if __name__ == "__main__":
    main()
