"""MLP classifier on scikit-learn's handwritten digits (1,797 8x8 images, shipped with sklearn)."""

from __future__ import annotations

import sys

import torch
from _loop import train
from sklearn.datasets import load_digits
from torch import nn

digits = load_digits()
X = torch.tensor(digits.data / 16.0, dtype=torch.float32)
Y = torch.tensor(digits.target, dtype=torch.long)


def batch(gen: torch.Generator, size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, len(X), (size,), generator=gen)
    return X[idx] + 0.05 * torch.randn(size, 64, generator=gen), Y[idx]


model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
sys.exit(train("mlp", model, batch, nn.functional.cross_entropy, default_steps=18_000, lr=3e-4))
