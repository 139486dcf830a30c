"""Denoising autoencoder on scikit-learn's digits: squeeze 64 pixels through 8 numbers and back."""

from __future__ import annotations

import sys

import torch
from _loop import train
from sklearn.datasets import load_digits
from torch import nn

X = torch.tensor(load_digits().data / 16.0, dtype=torch.float32)


def batch(gen: torch.Generator, size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    clean = X[torch.randint(0, len(X), (size,), generator=gen)]
    noisy = (clean + 0.2 * torch.randn(size, 64, generator=gen)).clamp(0, 1)
    return noisy, clean


model = nn.Sequential(
    nn.Linear(64, 256),
    nn.ReLU(),
    nn.Linear(256, 8),
    nn.ReLU(),
    nn.Linear(8, 256),
    nn.ReLU(),
    nn.Linear(256, 64),
    nn.Sigmoid(),
)
sys.exit(train("autoencoder", model, batch, nn.functional.mse_loss, default_steps=40_000))
