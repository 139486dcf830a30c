"""Baseline detectors the flow is compared with, side by side, in `sluice health eval`.

Each has the flow detector's shape — fit(train), score(series) -> one score per step,
`calibration` scores from held-out healthy data for the SPOT threshold — so the evaluation
treats every contender the same way. They see the same scaling and (where they take
windows) the same window length as the flow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from sklearn.decomposition import PCA
from sklearn.ensemble import IsolationForest
from torch import nn

from sluice.health.features import Array, Scaler, per_step, windows


class Detector(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def calibration(self) -> Array:
        """Scores of held-out healthy data (for the SPOT threshold)."""
        ...

    def fit(self, train: Array) -> object: ...
    def score(self, x: Array) -> Array: ...


def _split(x: Array, val_fraction: float = 0.2) -> tuple[Array, Array]:
    cut = int(len(x) * (1 - val_fraction))
    return x[:cut], x[cut:]


@dataclass
class PCADetector:
    """Reconstruction error outside the principal subspace (95 % of healthy variance)."""

    name: str = "pca"
    variance: float = 0.95
    calibration: Array = field(default_factory=lambda: np.zeros(0, np.float32))

    def fit(self, train: Array) -> None:
        self._scaler = Scaler.fit(train)
        tr, va = _split(self._scaler.transform(train))
        self._pca = PCA(n_components=self.variance, svd_solver="full").fit(tr)
        self.calibration = self._err(va)

    def _err(self, z: Array) -> Array:
        rec = self._pca.inverse_transform(self._pca.transform(z))
        return np.asarray(((z - rec) ** 2).sum(axis=1), dtype=np.float32)

    def score(self, x: Array) -> Array:
        return self._err(self._scaler.transform(x))


@dataclass
class IForestDetector:
    """Isolation Forest on single KPI vectors (sklearn, 200 trees)."""

    name: str = "iforest"
    seed: int = 0
    calibration: Array = field(default_factory=lambda: np.zeros(0, np.float32))

    def fit(self, train: Array) -> None:
        self._scaler = Scaler.fit(train)
        tr, va = _split(self._scaler.transform(train))
        self._forest = IsolationForest(n_estimators=200, random_state=self.seed, n_jobs=1).fit(tr)
        self.calibration = self.score_scaled(va)

    def score_scaled(self, z: Array) -> Array:
        return np.asarray(-self._forest.score_samples(z), dtype=np.float32)

    def score(self, x: Array) -> Array:
        return self.score_scaled(self._scaler.transform(x))


@dataclass
class AutoencoderDetector:
    """Dense autoencoder over flattened windows of `window` steps; score = reconstruction
    error of the newest step (so it flags the same moment the flow does)."""

    name: str = "autoencoder"
    window: int = 16
    latent: int = 16
    epochs: int = 30
    seed: int = 0
    calibration: Array = field(default_factory=lambda: np.zeros(0, np.float32))

    def fit(self, train: Array) -> None:
        torch.manual_seed(self.seed)
        self._scaler = Scaler.fit(train)
        z = self._scaler.transform(train)
        tr, va = _split(z)
        self._k = z.shape[1]
        d = self._k * self.window
        self._net = nn.Sequential(
            nn.Linear(d, 128),
            nn.ReLU(),
            nn.Linear(128, self.latent),
            nn.ReLU(),
            nn.Linear(self.latent, 128),
            nn.ReLU(),
            nn.Linear(128, d),
        )
        xs = torch.from_numpy(self._flat(tr))
        opt = torch.optim.Adam(self._net.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(self.seed)
        for _ in range(self.epochs):
            for idx in torch.randperm(len(xs), generator=gen).split(256):
                loss = ((self._net(xs[idx]) - xs[idx]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        self.calibration = self._err(va)

    def _flat(self, z: Array) -> Array:
        ctx, tgt = windows(z, self.window - 1, 1)
        return np.concatenate([ctx.reshape(len(ctx), -1), tgt], axis=1)

    @torch.no_grad()
    def _err(self, z: Array) -> Array:
        xs = torch.from_numpy(self._flat(z))
        rec = self._net(xs)
        err = ((rec - xs) ** 2)[:, -self._k :].sum(1).numpy()
        return np.asarray(err, dtype=np.float32)

    def score(self, x: Array) -> Array:
        return per_step(self._err(self._scaler.transform(x)), len(x))


def timed_fit(det: Detector, train: Array) -> float:
    t = time.perf_counter()
    det.fit(train)
    return time.perf_counter() - t
