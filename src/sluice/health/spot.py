"""SPOT: an extreme-value threshold for anomaly scores (Siffer et al., KDD'17).

Why not a fixed percentile: a percentile of healthy scores says nothing about how rare a
score *beyond* everything seen is. Peaks-over-threshold fits a generalised Pareto
distribution (GPD) to the excesses over a high initial threshold t, and extrapolates the
score z_q that healthy data exceeds with probability q:

    z_q = t + σ/γ · ((q·n / N_t)^(−γ) − 1)      (γ ≠ 0)
    z_q = t − σ · ln(q·n / N_t)                  (γ = 0)

with n scores seen, N_t of them above t. The streaming form keeps refitting as new
non-alarm peaks arrive, so the threshold follows slow drift of a healthy node.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy import stats


def fit_gpd(excesses: NDArray[np.floating]) -> tuple[float, float]:
    """(γ shape, σ scale) of a GPD fitted to positive excesses by maximum likelihood, with the
    method of moments as fallback when the MLE fails or is degenerate."""
    y = np.asarray(excesses, dtype=np.float64)
    y = y[y > 0]
    if len(y) < 3:
        return 0.0, float(y.mean()) if len(y) else 1e-6
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c, _loc, scale = stats.genpareto.fit(y, floc=0.0)
        if np.isfinite(c) and np.isfinite(scale) and scale > 0:
            return float(c), float(scale)
    except (ValueError, RuntimeError, FloatingPointError):
        pass
    m, v = float(y.mean()), float(y.var())
    if v <= 0:
        return 0.0, max(m, 1e-6)
    gamma = 0.5 * (1 - m * m / v)
    return gamma, max(0.5 * m * (m * m / v + 1), 1e-6)


def pot_threshold(t: float, gamma: float, sigma: float, q: float, n: int, n_peaks: int) -> float:
    r = q * n / max(n_peaks, 1)
    if abs(gamma) < 1e-9:
        return t - sigma * math.log(r)
    return t + sigma / gamma * (r ** (-gamma) - 1)


@dataclass
class Spot:
    """q: risk (chance a healthy score exceeds the threshold); level: quantile of the
    calibration scores used as the initial threshold t."""

    q: float = 1e-3
    level: float = 0.98
    init: float = float("nan")
    threshold: float = float("nan")
    gamma: float = 0.0
    sigma: float = 0.0
    n: int = 0
    peaks: list[float] = field(default_factory=list)
    floor: float = float("-inf")
    """The threshold never goes below this (a caller's guard when calibration is short)."""
    ceiling: float = float("inf")
    """Nor above this: a GPD fitted to a handful of excesses can extrapolate without bound."""

    def fit(self, scores: NDArray[np.floating]) -> Spot:
        s = np.asarray(scores, dtype=np.float64)
        s = s[np.isfinite(s)]
        if len(s) == 0:
            raise ValueError("SPOT needs at least one finite calibration score")
        self.init = float(np.quantile(s, self.level))
        self.peaks = (s[s > self.init] - self.init).tolist()
        self.n = len(s)
        self._refit()
        return self

    def _refit(self) -> None:
        self.gamma, self.sigma = fit_gpd(np.asarray(self.peaks))
        z = pot_threshold(self.init, self.gamma, self.sigma, self.q, self.n, len(self.peaks))
        # The threshold never drops below the initial quantile (a GPD with a short tail and a
        # tiny sample can extrapolate downwards).
        self.threshold = min(max(z if math.isfinite(z) else self.init, self.init, self.floor), self.ceiling)

    def step(self, score: float) -> bool:
        """Feed one new score; True = alarm. Alarms do not update the model (a fault must not
        teach the threshold that faults are normal); other peaks do."""
        if score > self.threshold:
            return True
        self.n += 1
        if score > self.init:
            self.peaks.append(score - self.init)
            self._refit()
        return False

    def to_dict(self) -> dict[str, object]:
        return {
            "q": self.q,
            "level": self.level,
            "init": self.init,
            "n": self.n,
            "peaks": list(self.peaks),
            "floor": self.floor,
            "ceiling": self.ceiling,
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Spot:
        sp = cls(q=float(d["q"]), level=float(d["level"]))  # type: ignore[arg-type]
        sp.init, sp.n = float(d["init"]), int(d["n"])  # type: ignore[arg-type,call-overload]
        sp.peaks = [float(p) for p in d["peaks"]]  # type: ignore[attr-defined]
        sp.floor = float(d.get("floor", float("-inf")))  # type: ignore[arg-type]
        sp.ceiling = float(d.get("ceiling", float("inf")))  # type: ignore[arg-type]
        sp._refit()
        return sp


def dspot_alarms(
    calibration: NDArray[np.floating],
    scores: NDArray[np.floating],
    q: float = 1e-3,
    depth: int = 10,
    level: float = 0.98,
) -> NDArray[np.bool_]:
    """Drift-aware SPOT (DSPOT, Siffer et al., KDD'17) over a stream of scores: each score is
    judged by how far it lies above the mean of the `depth` newest scores that were *not*
    alarms, and the threshold on that excess is SPOT's, fitted on the calibration scores'
    excesses and updated by every non-alarm peak. Why: a node's score level drifts (a new job
    mix, a refitted model, a slowly warming machine), and a threshold fixed on the healthy
    scores of training time is then either always or never crossed; a fault is a jump over
    the recent level, which drift is not. Alarms do not move the level, so a long fault stays
    above it. Returns one bool per score (True = alarm)."""
    c = np.asarray(calibration, dtype=np.float64)
    c = c[np.isfinite(c)]
    depth = max(1, min(depth, len(c) // 2))
    if len(c) < depth + 2:
        raise ValueError(f"DSPOT needs more than {depth + 1} finite calibration scores, got {len(c)}")
    kernel = np.ones(depth) / depth
    level_before = np.convolve(c, kernel, mode="valid")[:-1]  # mean of the `depth` scores before each
    spot = Spot(q=q, level=level).fit(c[depth:] - level_before)
    recent = list(c[-depth:])
    total = float(sum(recent))
    out = np.zeros(len(scores), dtype=bool)
    for i, x in enumerate(np.asarray(scores, dtype=np.float64)):
        if not math.isfinite(x):
            continue
        alarm = spot.step(x - total / depth)
        out[i] = alarm
        if not alarm:
            total += x - recent.pop(0)
            recent.append(x)
    return out
