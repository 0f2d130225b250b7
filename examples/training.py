"""What the examples share: their common options, a dataset whose samples cost decoding time,
and the traced training loop (``traceml.trace_step`` around each step). The scripts beside it
and ``smoke_tests/`` (through its pytest.ini's ``pythonpath``) import it; copy it with them."""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import traceml_ci as traceml


def job_options(description: str | None, steps: int) -> argparse.ArgumentParser:
    """The options every example takes (``--steps``, ``--batch-size``); a script adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch-size", type=int, default=16)
    return parser


def repeatable() -> None:
    """The same weights and data on every run, on one CPU thread: two runs differ by the code."""
    torch.manual_seed(0)
    torch.set_num_threads(1)


class Decoded(Dataset):
    """``n`` random samples of ``shape`` with labels 0-9; each sample costs ``decode_ms`` of
    "decoding", like a JPEG pipeline: asleep (I/O-like), or ``busy`` on the CPU."""

    def __init__(self, n: int, shape: tuple[int, ...], decode_ms: float = 0.0,
                 busy: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, *shape, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.decode_s = decode_ms / 1000.0
        self.busy = busy

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.decode_s and self.busy:
            end = time.perf_counter() + self.decode_s
            while time.perf_counter() < end:
                pass
        elif self.decode_s:
            time.sleep(self.decode_s)
        return self.x[i], self.y[i]


def fit(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer,
        steps: int) -> tuple[int, float]:
    """At most ``steps`` classification steps, each traced; the steps run and the last loss."""
    criterion = nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(loader):
        with traceml.trace_step(model):
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        if step + 1 >= steps:
            break
    return step + 1, loss.item()
