"""A Lightning MLP with automatic optimization and known costs, for the Lightning tests.

Run as a script (``traceml-ci run lightning_job.py WATCH.json [--callback]``, with the
repository on PYTHONPATH) it trains -- without any traceml-ci code unless ``--callback`` -- and
writes its stopwatch to WATCH.json.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, default_collate

from tests.integrations.spin import (
    SpinDataset,
    Stopwatch,
    spin_backward,
    spin_forward,
    spin_optimizer,
    timed,
    timed_collate,
)

BATCH, STEPS, WARMUP = 4, 25, 5
# Known costs (ms): per item, per forward, per backward, per optimizer step (its own time).
ITEM_MS, FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS = 1.5, 7.0, 7.0, 7.0


class SpinMLP(L.LightningModule):
    def __init__(self, watch: Stopwatch, optimizer_ms: float = OPTIMIZER_MS) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        self.watch = watch
        self.optimizer_ms = optimizer_ms
        self.fail_at: int | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return spin_forward(self.net, x, FORWARD_MS, self.watch)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == self.fail_at:
            raise RuntimeError("boom")
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        return spin_backward(loss, BACKWARD_MS)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        # Lightning's hook that runs loss.backward(): the stopwatch's backward, timed whole.
        timed(super().backward, "backward", self.watch)(loss, *args, **kwargs)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # The stopwatch's optimizer: the torch optimizer's step as Lightning calls it, timed
        # whole (torch's step wrapper too), its closure's forward and backward taken out.
        spin_sgd = spin_optimizer(torch.optim.SGD, self.optimizer_ms, self.watch,
                                  ends_step=False)
        opt = spin_sgd(self.parameters(), lr=0.01)
        opt.step = timed(opt.step, "optimizer", self.watch, ends_step=True)
        return opt


def item(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(32, generator=g), torch.randn(1, generator=g)


def loader(watch: Stopwatch, batches: int = STEPS, item_ms: float = ITEM_MS) -> DataLoader:
    data = SpinDataset(batches * BATCH, item_ms, item, watch)
    return DataLoader(data, batch_size=BATCH, collate_fn=timed_collate(default_collate, watch))


def trainer(callbacks: list, max_steps: int = STEPS, **kwargs: Any) -> L.Trainer:
    return L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        **kwargs,
    )


def main(watch_path: str, callback: bool = False) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    watch = Stopwatch()
    callbacks = []
    if callback:
        from traceml_ci.integrations.lightning import TraceMLCallback

        callbacks.append(TraceMLCallback(out_dir="ignored: traceml-ci run --out wins"))
    trainer(callbacks).fit(SpinMLP(watch), loader(watch))
    watch.dump(Path(watch_path))


if __name__ == "__main__":
    main(sys.argv[1], callback="--callback" in sys.argv[2:])
