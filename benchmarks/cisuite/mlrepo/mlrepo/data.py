"""Synthetic stand-ins for the real datasets: small images with a light augmentation (a random
flip and crop, as torchvision's transforms would do), and a token stream for the language model."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SyntheticImages(Dataset):
    """``n`` random 3x32x32 images with labels, augmented on every read."""

    def __init__(self, n: int = 512, size: int = 32, num_classes: int = 10, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.rand(n, 3, size, size, generator=g)
        self.labels = torch.randint(0, num_classes, (n,), generator=g)
        self.size = size

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[i]
        if random.random() < 0.5:
            image = image.flip(-1)
        padded = F.pad(image[None], (4, 4, 4, 4), mode="reflect")[0]
        top, left = random.randint(0, 8), random.randint(0, 8)
        image = padded[:, top:top + self.size, left:left + self.size]
        image = (image - 0.5) / 0.25
        return image, self.labels[i]


def stack_samples(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """Collate (image, label) pairs by hand."""
    images = torch.stack([image for image, _ in batch])
    labels = torch.tensor([int(label) for _, label in batch])
    return images, labels


def image_loader(dataset: Dataset, batch_size: int = 32, num_workers: int = 2) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        pin_memory=False,
        persistent_workers=num_workers > 0,
        prefetch_factor=2 if num_workers > 0 else None,
    )


class TokenBlocks(Dataset):
    """Fixed-length blocks of a synthetic token stream (a random walk over the vocabulary, so
    there is something to learn)."""

    def __init__(self, n_blocks: int = 256, block: int = 32, vocab_size: int = 512,
                 seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        steps = torch.randint(-3, 4, (n_blocks * block,), generator=g)
        self.tokens = steps.cumsum(0).remainder(vocab_size).view(n_blocks, block)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tokens[i]


def token_loader(dataset: Dataset, batch_size: int = 8) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True)


def regression_loader(n: int = 4096, features: int = 64, batch_size: int = 16,
                      seed: int = 0) -> DataLoader:
    """A tabular regression task: y is a fixed random function of x, plus noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=True)
