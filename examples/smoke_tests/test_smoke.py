"""Training smoke tests gated by traceml-ci: each runs a few dozen steps of a real training
loop; the plugin traces it and compares where the step time went with traceml-baseline.json.

    pytest examples/smoke_tests                               # gate on the committed baseline
    pytest examples/smoke_tests --traceml-update-baseline     # accept the current behaviour
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from training import Decoded, fit


def images(n: int, decode_ms: float = 0.0) -> Decoded:
    """Small random "images"; ``decode_ms`` emulates per-sample decoding work (busy CPU)."""
    return Decoded(n, (3, 16, 16), decode_ms, busy=True)


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, 10),
    )


def train(model: nn.Module, data: Dataset, steps: int, batch_size: int = 16) -> float:
    """The training loop under test (``training.fit``: each step in ``traceml.trace_step``)."""
    torch.manual_seed(0)
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return fit(model, loader, optimizer, steps)[1]


@pytest.mark.traceml(warmup_steps=5)
def test_cnn_is_compute_bound(traceml) -> None:
    loss = train(small_cnn(), images(16 * 80), steps=80)
    assert loss == loss  # finite
    summary = traceml.finish()  # the summary the plugin gates, for extra asserts
    assert summary["step_time"]["steps_analyzed"] == 75  # 80 steps, 5 of warmup


@pytest.mark.traceml(warmup_steps=5, key="slow-decoding")
def test_slow_decoding_is_input_bound() -> None:
    # 3 ms of decoding per sample, 8 samples per batch: the loader dominates the step.
    train(small_cnn(), images(8 * 30, decode_ms=3.0), steps=30, batch_size=8)


def test_example_script(traceml) -> None:
    # A script run as `traceml-ci run ../compute_bound.py ...`, gated the same way.
    summary = traceml.run_script(
        "../compute_bound.py", "--steps", "30", "--batch-size", "8", warmup_steps=5
    )
    assert summary["run"]["status"] == "completed"
