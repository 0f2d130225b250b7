"""The documented Accelerate recipe (docs/integrations.md), with a real ``accelerate.Accelerator``
on CPU: trace_step around the loop body, ``accelerator.backward``, prepared optimizer and loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.conftest import load_summary
from tests.integrations.spin import (
    SpinDataset,
    Stopwatch,
    assert_shares_match,
    spin_backward,
    spin_forward,
    spin_optimizer,
    timed,
    timed_batches,
    timed_collate,
)

pytestmark = pytest.mark.integration

accelerate = pytest.importorskip("accelerate")  # imported before init(): the usual order
torch = pytest.importorskip("torch")

BATCH, STEPS, WARMUP = 4, 30, 5
ITEM_MS, FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS = 1.0, 4.0, 4.0, 4.0


class SpinNet(torch.nn.Module):
    def __init__(self, watch: Stopwatch) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )
        self.watch = watch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return spin_forward(self.net, x, FORWARD_MS, self.watch)


def item(i: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return {"x": torch.randn(32, generator=g), "y": torch.randn(1, generator=g)}


def test_recipe_shares_within_2pp_of_a_stopwatch(tmp_path: Path) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from torch.utils.data import DataLoader, default_collate

    import traceml_ci as traceml

    AcceleratorState._reset_state(reset_partial_state=True)  # another test's Accelerator
    watch = Stopwatch()
    torch.manual_seed(0)
    # --- the recipe -------------------------------------------------------------------------
    traceml.init(out_dir=tmp_path, warmup_steps=WARMUP)  # before the optimizer is built
    accelerator = Accelerator(cpu=True)
    model = SpinNet(watch)
    spin_sgd = spin_optimizer(torch.optim.SGD, OPTIMIZER_MS, watch, ends_step=False)
    optimizer = spin_sgd(model.parameters(), lr=0.01)
    data = SpinDataset(STEPS * BATCH, ITEM_MS, item, watch)
    loader = DataLoader(data, batch_size=BATCH, collate_fn=timed_collate(default_collate, watch))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    # The stopwatch times whole calls: the backward and each batch the prepared loader
    # yields (the DataLoader's own fetch loop too), and the torch optimizer's step as
    # Accelerate's wrapper calls it (torch's step wrapper too; the wrapper's own checks
    # around it are other: docs/integrations.md).
    backward = timed(accelerator.backward, "backward", watch)
    inner = optimizer.optimizer
    inner.step = timed(inner.step, "optimizer", watch, ends_step=True)
    for batch in timed_batches(loader, watch):
        with traceml.trace_step(model):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            backward(spin_backward(loss, BACKWARD_MS))
            optimizer.step()
    path = traceml.finish()
    # ----------------------------------------------------------------------------------------
    assert path == tmp_path / "final_summary.json"
    doc = load_summary(tmp_path)
    assert type(optimizer).__name__ == "AcceleratedOptimizer"
    assert doc["step_time"]["steps_total"] == STEPS == len(watch.step_ends)
    assert doc["run"]["mode"] == "auto"
    assert_shares_match(doc, watch)
