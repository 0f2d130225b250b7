"""The callback under the old package name, ``pytorch_lightning``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.conftest import load_summary

pytestmark = pytest.mark.integration

pl = pytest.importorskip("pytorch_lightning")


def test_pytorch_lightning_trainer_gets_one_step_per_optimizer_step(tmp_path: Path) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from traceml_ci.integrations.pytorch_lightning import TraceMLCallback

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)  # self.net, not self(x)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = TensorDataset(torch.randn(24, 8), torch.randn(24, 1))
    trainer = pl.Trainer(
        max_steps=6,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[TraceMLCallback(out_dir=tmp_path, warmup_steps=0)],
    )
    trainer.fit(MLP(), DataLoader(data, batch_size=4))
    st = load_summary(tmp_path)["step_time"]
    assert st["steps_total"] == 6
    assert st["throughput"]["batch_size"] == 4
