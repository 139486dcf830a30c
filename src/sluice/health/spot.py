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
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy import optimize


def fit_gpd(excesses: NDArray[np.floating]) -> tuple[float, float]:
    """(γ shape, σ scale) of a GPD fitted to positive excesses by maximum likelihood, with the
    method of moments as fallback when the fit fails or is degenerate.

    The likelihood is maximised over one variable, θ = γ/σ (Grimshaw's reduction, as in the
    SPOT paper): for a given θ the best γ is the mean of log(1 + θy), so the profile
    likelihood is scanned on a grid of θ at once and the best cell refined by a bounded
    scalar search. Why not scipy's generic `genpareto.fit`: streaming SPOT refits on every
    healthy peak, and the generic optimiser made a DSPOT pass over one ASD server take
    seconds (same estimates to 3-4 digits on every ASD calibration set, 10x faster)."""
    y = np.asarray(excesses, dtype=np.float64)
    y = y[y > 0]
    n = len(y)
    if n < 3:
        return 0.0, float(y.mean()) if n else 1e-6
    ybar, ymax = float(y.mean()), float(y.max())

    def negll(theta: float) -> float:
        if abs(theta) < 1e-12:  # γ = 0: exponential excesses
            return n * math.log(ybar) + n
        v = float(np.log1p(theta * y).mean())
        sigma = v / theta
        if not (math.isfinite(v) and sigma > 0):
            return math.inf
        return n * math.log(sigma) + n * (v + 1)

    u = np.concatenate([-(ybar / ymax) * np.linspace(0.999, 0.001, 40), [0.0], np.geomspace(1e-4, 1e4, 120)])
    thetas = u / ybar
    with np.errstate(all="ignore"):
        v = np.log1p(np.outer(thetas, y)).mean(axis=1)
        sig = v / np.where(thetas == 0, 1.0, thetas)
        vals = np.where(sig > 0, n * np.log(np.where(sig > 0, sig, 1.0)) + n * (v + 1), np.inf)
    vals[thetas == 0] = n * math.log(ybar) + n
    i = int(np.argmin(vals))
    best_t, best_v = float(thetas[i]), float(vals[i])
    lo, hi = float(thetas[max(i - 1, 0)]), float(thetas[min(i + 1, len(thetas) - 1)])
    if hi > lo:
        try:
            r = optimize.minimize_scalar(
                negll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10 * max(abs(lo), abs(hi), 1e-12)}
            )
            if math.isfinite(float(r.fun)) and float(r.fun) <= best_v:
                best_t, best_v = float(r.x), float(r.fun)
        except (ValueError, FloatingPointError):
            pass
    if math.isfinite(best_v):
        if abs(best_t) < 1e-12:
            return 0.0, ybar
        gamma = float(np.log1p(best_t * y).mean())
        sigma = gamma / best_t
        if math.isfinite(gamma) and math.isfinite(sigma) and sigma > 0:
            return gamma, sigma
    m, var = ybar, float(y.var())
    if var <= 0:
        return 0.0, max(m, 1e-6)
    gamma = 0.5 * (1 - m * m / var)
    return gamma, max(0.5 * m * (m * m / var + 1), 1e-6)


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


@dataclass
class DSpot:
    """Drift-aware SPOT (DSPOT, Siffer et al., KDD'17), one score at a time: each score is
    judged by how far it lies above the mean of the `depth` newest scores that were *not*
    alarms, and the threshold on that excess is SPOT's (`spot`), fitted on the calibration
    scores' excesses and updated by every non-alarm peak.

    Why: a node's score level drifts (a new job mix, a refitted model, a slowly warming
    machine), and a threshold fixed on the healthy scores of training time is then either
    always or never crossed; a fault is a jump over the recent level, which drift is not.
    Alarms do not move the level, so a long fault stays above it. The price: a fault that
    creeps in more slowly than `depth` scores is followed, not flagged."""

    spot: Spot
    depth: int = 10
    recent: list[float] = field(default_factory=list)
    total: float = 0.0

    @staticmethod
    def excesses(calibration: NDArray[np.floating], depth: int) -> tuple[NDArray[np.float64], int]:
        """The calibration scores' excesses over their own running level, and the depth used
        (at most half the scores, so a short calibration still leaves excesses to fit)."""
        c = np.asarray(calibration, dtype=np.float64)
        c = c[np.isfinite(c)]
        depth = max(1, min(depth, len(c) // 2))
        if len(c) < depth + 2:
            raise ValueError(f"DSPOT needs more than {depth + 1} finite calibration scores, got {len(c)}")
        level_before = np.convolve(c, np.ones(depth) / depth, mode="valid")[:-1]
        return c[depth:] - level_before, depth

    def fit(self, calibration: NDArray[np.floating]) -> DSpot:
        """Fit `spot` on the calibration excesses (its floor and ceiling, if set, bound the
        excess) and start the level from the newest calibration scores."""
        ex, self.depth = self.excesses(calibration, self.depth)
        self.spot.fit(ex)
        c = np.asarray(calibration, dtype=np.float64)
        self.recent = [float(x) for x in c[np.isfinite(c)][-self.depth :]]
        self.total = float(sum(self.recent))
        return self

    @property
    def level(self) -> float:
        return self.total / max(len(self.recent), 1)

    @property
    def threshold(self) -> float:
        """The score the next sample must exceed to alarm: the recent level plus the excess
        threshold."""
        return self.level + self.spot.threshold

    def step(self, score: float) -> bool:
        """Feed one new score; True = alarm. Non-finite scores are skipped (no alarm)."""
        if not math.isfinite(score):
            return False
        alarm = self.spot.step(score - self.level)
        if not alarm:
            self.total += score - self.recent.pop(0)
            self.recent.append(score)
        return alarm

    def to_dict(self) -> dict[str, object]:
        return {"spot": self.spot.to_dict(), "depth": self.depth, "recent": list(self.recent)}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> DSpot:
        recent = [float(x) for x in d["recent"]]  # type: ignore[attr-defined]
        out = cls(Spot.from_dict(d["spot"]), int(d["depth"]), recent)  # type: ignore[arg-type,call-overload]
        out.total = float(sum(recent))
        return out


def dspot_alarms(
    calibration: NDArray[np.floating],
    scores: NDArray[np.floating],
    q: float = 1e-3,
    depth: int = 10,
    level: float = 0.98,
) -> NDArray[np.bool_]:
    """`DSpot` over a stream of scores (see there): one bool per score, True = alarm."""
    d = DSpot(Spot(q=q, level=level), depth).fit(calibration)
    return np.fromiter((d.step(float(x)) for x in np.asarray(scores, dtype=np.float64)), dtype=bool, count=len(scores))


def hysteresis(alarms: NDArray[np.bool_], scores: NDArray[np.floating], lower: float) -> NDArray[np.bool_]:
    """Hold each alarm while the score stays above `lower` (a second, lower threshold).

    Why: a fault's scores do not all clear an extreme-value threshold; after its first
    crossing they dip and rise around it, and each dip is a missed step of the fault. An
    alarm once raised is kept until the score falls back into the healthy bulk (`lower`,
    e.g. the calibration scores' 98 % quantile). Causal: step t uses only steps ≤ t."""
    a = np.asarray(alarms, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    out = a.copy()
    for i in range(1, len(a)):
        if not out[i] and out[i - 1] and s[i] > lower:
            out[i] = True
    return out
