"""Small CNN on scikit-learn's digits, seen as 1x8x8 images with random shifts (augmentation)."""

from __future__ import annotations

import sys

import torch
from _loop import train
from sklearn.datasets import load_digits
from torch import nn

digits = load_digits()
IMAGES = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
LABELS = torch.tensor(digits.target, dtype=torch.long)


def batch(gen: torch.Generator, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, len(IMAGES), (size,), generator=gen)
    dx, dy = (int(v) for v in torch.randint(-1, 2, (2,), generator=gen))
    return torch.roll(IMAGES[idx], shifts=(dy, dx), dims=(2, 3)), LABELS[idx]


model = nn.Sequential(
    nn.Conv2d(1, 32, 3, padding=1),
    nn.ReLU(),
    nn.Conv2d(32, 64, 3, padding=1),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Conv2d(64, 64, 3, padding=1),
    nn.ReLU(),
    nn.Flatten(),
    nn.Linear(64 * 4 * 4, 128),
    nn.ReLU(),
    nn.Linear(128, 10),
)
sys.exit(train("cnn", model, batch, nn.functional.cross_entropy, default_steps=6_000))
