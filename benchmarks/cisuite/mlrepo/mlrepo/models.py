"""The models: a small CNN, a tiny GPT-2 built from its config, and an MLP regressor."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, kernel_size=3, padding=1)
        self.conv3 = nn.Conv2d(2 * width, 4 * width, kernel_size=3, padding=1)
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.conv3(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def tiny_gpt2(vocab_size: int = 512, context: int = 64) -> GPT2LMHeadModel:
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=vocab_size,
                        n_positions=context)
    return GPT2LMHeadModel(config)


class MLP(nn.Module):
    def __init__(self, features: int = 64, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.GELU(),
            nn.Linear(hidden, hidden), nn.GELU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
