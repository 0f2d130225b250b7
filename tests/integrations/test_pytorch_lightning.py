"""The callback under the old package name, ``pytorch_lightning``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.conftest import load_summary

pytestmark = pytest.mark.integration

pl = pytest.importorskip("pytorch_lightning")

import torch  # noqa: E402  (after the skip: pytorch_lightning brings it)
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from traceml_ci.integrations.pytorch_lightning import TraceMLCallback  # noqa: E402


class MLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)  # self.net, not self(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _trainer(out: Path, warmup_steps: int, **given: Any) -> pl.Trainer:
    """A quiet CPU Trainer with the callback writing to ``out``; ``given`` is what a test is
    about (steps, validation)."""
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[TraceMLCallback(out_dir=out, warmup_steps=warmup_steps)],
        **given,
    )


def test_pytorch_lightning_trainer_gets_one_step_per_optimizer_step(tmp_path: Path) -> None:
    data = TensorDataset(torch.randn(24, 8), torch.randn(24, 1))
    _trainer(tmp_path, 0, max_steps=6).fit(MLP(), DataLoader(data, batch_size=4))
    st = load_summary(tmp_path)["step_time"]
    assert st["steps_total"] == 6
    assert st["throughput"]["batch_size"] == 4


def test_validation_is_evaluation_time_not_training_time(tmp_path: Path) -> None:
    """Issue 20: periodic validation (not the sanity check) is between_steps' eval_s."""
    from tests.conftest import busy

    val_batch_ms = 10.0
    spans: list[tuple[float, float]] = []

    class Validated(MLP):
        def validation_step(self, batch: tuple, batch_idx: int) -> None:
            busy(val_batch_ms)

        def on_validation_start(self) -> None:
            spans.append((time.perf_counter(), 0.0))

        def on_validation_end(self) -> None:
            spans[-1] = (spans[-1][0], time.perf_counter())

    data = TensorDataset(torch.randn(160, 8), torch.randn(160, 1))
    trainer = _trainer(tmp_path, 2, max_steps=40, val_check_interval=8, num_sanity_val_steps=2)
    trainer.fit(
        Validated(), DataLoader(data, batch_size=4),
        DataLoader(TensorDataset(*data[:12]), batch_size=4),
    )
    b = load_summary(tmp_path)["step_time"]["between_steps"]
    runs = [t1 - t0 for t0, t1 in spans[1:]]  # spans[0]: the sanity check, before training
    assert len(runs) >= 4
    assert 1 <= b["evals"] <= len(runs)
    assert 0.8 * b["evals"] * min(runs) <= b["eval_s"] <= sum(runs) * 1.1 + 0.01
    assert b["eval_s"] <= b["between_s"] + 1e-3 and b["eval_pct"] > 10
