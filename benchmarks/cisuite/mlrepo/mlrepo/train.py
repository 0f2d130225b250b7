"""Training loops. Each step is wrapped in ``traceml.trace_step`` so that the CI smoke tests can
see where its time goes; outside a traced test it costs next to nothing."""

from __future__ import annotations

import copy
import json

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import traceml_ci as traceml


def progress_line(epoch: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """One JSON line of training progress (written once per run)."""
    return json.dumps({"epoch": epoch, "lr": optimizer.param_groups[0]["lr"],
                       "parameters": sum(p.numel() for p in model.parameters())})


def train_cnn(model: nn.Module, loader: DataLoader, epochs: int = 4,
              lr: float = 0.05) -> tuple[float, dict[str, torch.Tensor]]:
    """Classification with SGD; returns the mean loss and the final weights."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    losses, progress = [], []
    for _epoch in range(epochs):
        for images, labels in loader:
            with traceml.trace_step(model):
                optimizer.zero_grad(set_to_none=True)
                logits = model(images)
                loss = F.cross_entropy(logits, labels)
                loss.backward()
                optimizer.step()
                losses.append(loss.detach())
    progress.append(progress_line(epochs, model, optimizer))
    final_state = copy.deepcopy(model.state_dict())
    return float(sum(losses) / len(losses)), final_state


@torch.no_grad()
def evaluate(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    model.eval()
    loss = model(input_ids=tokens, labels=tokens).loss
    model.train()
    return loss


def train_lm(model: nn.Module, loader: DataLoader, val_tokens: torch.Tensor, steps: int = 30,
             lr: float = 3e-4) -> float:
    """Causal language modelling with AdamW and gradient clipping; the validation loss is
    tracked on a fixed batch every step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    predictions, val_losses = [], []
    for step, tokens in enumerate(loader):
        if step == steps:
            break
        with traceml.trace_step(model):
            out = model(input_ids=tokens, labels=tokens)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            predictions.append(out.logits.argmax(-1))
            val_losses.append(evaluate(model, val_tokens))
    return torch.stack(val_losses).mean().item()


def train_accumulated(model: nn.Module, loader: DataLoader, steps: int = 20,
                      accum_steps: int = 4, bf16: bool = False) -> float:
    """Regression with gradient accumulation: one optimizer step per ``accum_steps``
    micro-batches (a traced step is one optimizer step)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = iter(loader)
    total = torch.zeros(())
    for _step in range(steps):
        with traceml.trace_step(model):
            for _micro in range(accum_steps):
                inputs, targets = next(batches)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = F.mse_loss(model(inputs).float(), targets) / accum_steps
                loss.backward()
                total = total + loss.detach()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return total.item() / steps
