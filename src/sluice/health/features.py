"""KPI windows: scaling fitted on healthy history and the (history, target) pairs the flow models.

Why a separate module: the detector, the baselines and the online monitor must cut windows
and scale values the same way, or scores from training and from serving are not comparable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float32]


@dataclass
class Scaler:
    """Per-KPI standardisation fitted on healthy data.

    The spread is floored (`min_scale`) so a KPI that was constant while healthy (an idle
    disk, no swap) does not turn the first small wobble into an infinite z-score; values are
    clipped to ±`clip` so one absurd sample cannot dominate a density model.
    """

    mean: Array
    scale: Array
    clip: float = 10.0

    @classmethod
    def fit(cls, x: Array, min_scale: float = 0.02, clip: float = 10.0, min_abs: Array | None = None) -> Scaler:
        """`min_abs`: per-KPI floor of the spread in the KPI's own units (0 = none), for
        KPIs whose readings move in known steps (CPU shares in clock ticks)."""
        x = np.asarray(x, dtype=np.float32)
        mean = x.mean(axis=0)
        std = x.std(axis=0)
        span = x.max(axis=0) - x.min(axis=0)
        floor = np.maximum(min_scale * np.maximum(span, np.abs(mean)), 1e-3)
        if min_abs is not None:
            floor = np.maximum(floor, np.asarray(min_abs, dtype=np.float32))
        return cls(mean.astype(np.float32), np.maximum(std, floor).astype(np.float32), clip)

    def transform(self, x: Array) -> Array:
        z = (np.asarray(x, dtype=np.float32) - self.mean) / self.scale
        return np.clip(z, -self.clip, self.clip).astype(np.float32)

    def to_dict(self) -> dict[str, list[float] | float]:
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist(), "clip": self.clip}

    @classmethod
    def from_dict(cls, d: dict[str, list[float] | float]) -> Scaler:
        mean, scale, clip = d["mean"], d["scale"], d["clip"]
        assert isinstance(mean, list) and isinstance(scale, list) and isinstance(clip, float | int)
        return cls(np.asarray(mean, np.float32), np.asarray(scale, np.float32), float(clip))


def windows(x: Array, history: int, target: int) -> tuple[Array, Array]:
    """Cut a (T, K) series into every (history, target) pair.

    Returns `ctx` (N, history, K) — what the encoder summarises — and `tgt` (N, target*K)
    — the window whose density is modelled; window n ends at time step history+target-1+n.
    A series shorter than one window is left-padded with its first row, so every caller
    (the online monitor right after training, a short test file) gets a score per step.
    """
    x = np.asarray(x, dtype=np.float32)
    need = history + target
    if len(x) < need:
        pad = np.repeat(x[:1], need - len(x), axis=0)
        x = np.concatenate([pad, x])
    full = np.lib.stride_tricks.sliding_window_view(x, need, axis=0)  # (N, K, need)
    full = np.array(full.transpose(0, 2, 1), copy=True)  # (N, need, K), writable for torch
    ctx = full[:, :history]
    tgt = full[:, history:].reshape(len(full), -1)
    return ctx, tgt


def per_step(window_scores: Array, length: int) -> Array:
    """Spread window scores back onto time steps: step t gets the score of the window that
    ends at t; the first steps (no full window yet) get the first window's score."""
    window_scores = np.asarray(window_scores, dtype=np.float32)
    out = np.empty(length, dtype=np.float32)
    n = len(window_scores)
    if n >= length:
        out[:] = window_scores[-length:]
    else:
        out[length - n :] = window_scores
        out[: length - n] = window_scores[0]
    return out
