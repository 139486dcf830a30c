"""LSTM forecaster: predict the next value of noisy two-tone signals (generated, no download)."""

from __future__ import annotations

import sys

import torch
from _loop import train
from torch import nn

SEQ = 48


def batch(gen: torch.Generator, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.arange(SEQ + 1, dtype=torch.float32)
    freq = 0.05 + 0.25 * torch.rand(size, 2, 1, generator=gen)
    phase = 6.283 * torch.rand(size, 2, 1, generator=gen)
    amp = 0.5 + torch.rand(size, 2, 1, generator=gen)
    wave = (amp * torch.sin(freq * t + phase)).sum(1) + 0.05 * torch.randn(size, SEQ + 1, generator=gen)
    return wave[:, :SEQ, None], wave[:, 1:, None]


class Forecaster(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, 96, num_layers=2, batch_first=True)
        self.head = nn.Linear(96, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out)


sys.exit(train("lstm", Forecaster(), batch, nn.functional.mse_loss, default_steps=2_500, lr=3e-3))
