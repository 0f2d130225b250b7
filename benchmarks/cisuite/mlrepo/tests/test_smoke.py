"""Training smoke tests, gated by traceml-ci: each runs a few dozen real steps."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from mlrepo.data import SyntheticImages, TokenBlocks, image_loader, regression_loader, token_loader
from mlrepo.models import MLP, SmallCNN, tiny_gpt2
from mlrepo.train import train_accumulated, train_cnn, train_lm

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.traceml(warmup_steps=5)
def test_cnn_trains() -> None:
    torch.manual_seed(0)
    loss, _ = train_cnn(SmallCNN(), image_loader(SyntheticImages(n=512)), epochs=4)
    assert math.isfinite(loss)


@pytest.mark.traceml(warmup_steps=5)
def test_gpt2_trains() -> None:
    torch.manual_seed(0)
    data = TokenBlocks(n_blocks=512)
    val_tokens = TokenBlocks(n_blocks=8, seed=1).tokens
    loss = train_lm(tiny_gpt2(), token_loader(data), val_tokens, steps=60)
    assert math.isfinite(loss)


@pytest.mark.traceml(warmup_steps=5)
def test_grad_accumulation() -> None:
    torch.manual_seed(0)
    loss = train_accumulated(MLP(), regression_loader(), steps=40, accum_steps=4)
    assert math.isfinite(loss)


def test_ddp_two_ranks(traceml) -> None:
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    summary = traceml.run_script("../mlrepo/ddp_train.py", "--steps", "40", nproc_per_node=2,
                                 warmup_steps=5, env=env)
    assert summary["run"]["status"] == "completed"
