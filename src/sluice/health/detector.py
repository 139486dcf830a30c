"""The node anomaly detector: a conditional normalizing flow over KPI windows.

Why a flow: it gives an exact log-likelihood of each window, so "how unlikely is what this
node just did, given what it was doing a moment ago" is one number with a meaning, and the
same model can be sampled to say *which* KPIs were unlikely (attribution). As in conditional
RealNVP, a recurrent encoder (GRU) summarises the recent history into the flow's context;
the flow models the density of the newest `target` steps. Score = negative log-likelihood.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import zuko
from torch import nn

from sluice.health.features import Array, Scaler, per_step, windows


@dataclass
class DetectorConfig:
    """Knobs of the flow detector (defaults tuned on ASD, see docs/health.md).

    history:   steps the encoder reads before the modelled window.
    encoder:   what summarises the history into the flow's context. "gru": one GRU over
               the window's KPI vectors. "graph": each KPI's own series through a shared
               GRU, then one round of attention between the KPIs (a dynamic graph learned
               per window, after GANF/MTGFlow), so the context says which KPIs moved
               together and which moved alone.
    target:    steps in the modelled window (its density is over target*K values). 4: chosen
               by the leave-servers-out protocol over model settings on ASD (K = 3, five seeds,
               `scripts/health_model_protocol.py`, docs/health.md): held-out automatic F1 0.392
               against 0.346 for target 1, higher on every seed. A fault that lasts several
               steps is unlikely jointly over them where each step alone may pass. The live
               monitor keeps 1 (`monitor._online_detector`): replayed on campaign 17, 4 alarmed
               on healthy nodes and cordoned one, 1 did not (docs/benchmarks.md).
    hidden:    GRU state size and flow hidden-layer width.
    transforms: coupling layers in the RealNVP.
    noise:     std of Gaussian dequantisation noise added while training (in scaled units);
               keeps the flow from collapsing onto KPIs that sit on a few exact values.
    epochs/batch/lr: optimiser; `max_train_s` caps training wall time.
    val_fraction: newest share of the healthy series held out for early stopping and for the
               threshold's calibration scores (scores on data the model never fitted).
    smooth:    a score is a weighted mean of the NLLs of this many newest windows (1 = off);
               short spikes of a single KPI are rarely faults worth acting on.
    decay:     weight of the newest window in that mean, older ones decaying geometrically
               (0 = equal weights). 0.7 keeps a fault's first high NLL almost undiluted —
               an early first hit is what point-adjusted F1 rewards and what an operator
               wants — while still damping one-step noise; chosen on ASD servers omi-1..6
               (docs/benchmarks.md).
    threads:   torch intra-op threads, set for the process when fitting (0 = torch's
               default). 1 by default: the models are small, and on a shared 2-core machine
               two threads spend more time waiting for each other than computing
               (training took about half the time with 1 thread under load).
    """

    history: int = 16
    encoder: str = "gru"
    target: int = 4
    hidden: int = 64
    transforms: int = 4
    noise: float = 0.05
    epochs: int = 12
    batch: int = 512
    lr: float = 2e-3
    max_train_s: float = 100.0
    val_fraction: float = 0.2
    smooth: int = 5
    decay: float = 0.7
    seed: int = 0
    threads: int = 1
    min_scale: float = 0.02
    """Floor of each KPI's spread, as a share of its healthy range or level: how small a
    change may count as many standard deviations. Raise it for short, calm training windows."""
    pct_floor: float = 0.0
    """Floor of the spread of every KPI named `*_pct`, in percentage points (0 = none). The
    kernel counts CPU time in clock ticks (USER_HZ = 100 a second), so a core's share over a
    one-second sample moves in steps of one point: a share that read 0 or 1 % while the model
    learned would otherwise make a three-point wobble — one process waking on that core —
    many standard deviations."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.decay <= 1.0:
            raise ValueError(f"decay: {self.decay} must be within [0, 1]")
        if self.smooth < 1:
            raise ValueError(f"smooth: {self.smooth} must be at least 1 window")
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder: {self.encoder!r} is not one of {', '.join(ENCODERS)}")


ENCODERS = ("gru", "graph")


class _GraphEncoder(nn.Module):
    """Per-KPI temporal summaries that attend to each other: a shared GRU reads each KPI's
    own history (plus a learned embedding naming the KPI), self-attention over the K
    summaries gives a K×K weighting for this window (the dynamic graph), and each KPI's
    summary gets its neighbours' messages added. The flattened result is projected to
    `hidden`. Why: a fault often shows as KPIs that usually move together parting ways
    (CPU busy with no I/O behind it), which a joint GRU state need not keep apart."""

    def __init__(self, k: int, hidden: int) -> None:
        super().__init__()
        d = max(8, hidden // 4)
        self.d = d
        self.series = nn.GRU(1, d, batch_first=True)
        self.name = nn.Parameter(torch.zeros(k, d))
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(k * d, hidden)

    def forward(self, hist: torch.Tensor) -> torch.Tensor:
        b, h, k = hist.shape
        _, last = self.series(hist.permute(0, 2, 1).reshape(b * k, h, 1))
        z = last[-1].reshape(b, k, self.d) + self.name
        weights = torch.softmax(self.query(z) @ self.key(z).transpose(1, 2) / self.d**0.5, dim=-1)
        z = self.norm(z + weights @ self.value(z))
        return torch.relu(self.out(z.reshape(b, k * self.d)))


class _Net(nn.Module):
    def __init__(self, k: int, cfg: DetectorConfig) -> None:
        super().__init__()
        self.k = k
        self.graph = _GraphEncoder(k, cfg.hidden) if cfg.encoder == "graph" else None
        self.encoder = None if self.graph is not None else nn.GRU(k, cfg.hidden, batch_first=True)
        ctx = cfg.hidden + k
        self.flow = zuko.flows.RealNVP(
            k * cfg.target, context=ctx, transforms=cfg.transforms, hidden_features=(cfg.hidden, cfg.hidden)
        )

    def context(self, hist: torch.Tensor) -> torch.Tensor:
        if self.graph is not None:
            summary = self.graph(hist)
        else:
            assert self.encoder is not None
            summary = self.encoder(hist)[1][-1]
        # The last observation goes in next to the summary: "what came just before" is the
        # strongest single predictor of a KPI, and the encoder need not learn to carry it.
        return torch.cat([summary, hist[:, -1]], dim=1)

    def nll(self, hist: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return -self.flow(self.context(hist)).log_prob(tgt)


def smooth_scores(s: Array, smooth: int, decay: float) -> Array:
    """Each score becomes a weighted mean of the newest `smooth` window NLLs: equal weights
    when `decay` is 0, else weight decay·(1−decay)^age, renormalised over the windows that
    exist. A heavy weight on the newest window keeps a fault's first high NLL visible at
    once (a plain mean delays and dilutes it) while older windows still damp one-step
    noise. A function of the raw NLLs alone, so these knobs can be chosen without retraining."""
    if smooth <= 1 or len(s) < 2:
        return s
    weights = np.ones(smooth) if decay <= 0 else decay * (1.0 - decay) ** np.arange(smooth)
    x = s.astype(np.float64)
    num, den = np.zeros(len(x)), np.zeros(len(x))
    for age, wt in enumerate(weights[: len(x)]):
        num[age:] += wt * x[: len(x) - age]
        den[age:] += wt
    return (num / den).astype(np.float32)


@dataclass
class FitReport:
    epochs: int
    seconds: float
    train_nll: float
    val_nll: float
    windows: int


@dataclass
class FlowDetector:
    """Fit on a healthy (T, K) series, then score any (T', K) series of the same KPIs."""

    config: DetectorConfig = field(default_factory=DetectorConfig)
    kpis: list[str] = field(default_factory=list)
    scaler: Scaler | None = None
    net: _Net | None = None
    calibration: Array = field(default_factory=lambda: np.zeros(0, np.float32))
    calibration_raw: Array = field(default_factory=lambda: np.zeros(0, np.float32))
    """The calibration windows' NLLs before smoothing: what a protocol that re-weights the
    score (smooth, decay) without retraining needs (`health/protocol.py`)."""
    report: FitReport | None = None

    def fit(self, train: Array, kpis: list[str] | None = None) -> FitReport:
        cfg = self.config
        torch.manual_seed(cfg.seed)
        rng = np.random.default_rng(cfg.seed)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        train = np.asarray(train, dtype=np.float32)
        k = train.shape[1]
        self.kpis = list(kpis) if kpis else [f"kpi{i}" for i in range(k)]
        pct = np.asarray([cfg.pct_floor if name.endswith("_pct") else 0.0 for name in self.kpis], dtype=np.float32)
        self.scaler = Scaler.fit(train, min_scale=cfg.min_scale, min_abs=pct)
        hist, tgt = windows(self.scaler.transform(train), cfg.history, cfg.target)
        n_val = int(len(hist) * cfg.val_fraction) if len(hist) >= 50 else 0
        # A gap of one window between train and validation so no validation target was a
        # training target.
        cut = len(hist) - n_val
        tr_h, tr_t = (
            torch.from_numpy(hist[: max(cut - cfg.history, 1)]),
            torch.from_numpy(tgt[: max(cut - cfg.history, 1)]),
        )
        va_h, va_t = torch.from_numpy(hist[cut:]), torch.from_numpy(tgt[cut:])
        self.net = _Net(k, cfg)
        opt = torch.optim.Adam(self.net.parameters(), lr=cfg.lr, weight_decay=1e-5)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(cfg.epochs, 1))
        best_state, best_val, epochs_done = None, float("inf"), 0
        start = time.perf_counter()
        train_nll = float("nan")
        for _epoch in range(cfg.epochs):
            self.net.train()
            order = torch.from_numpy(rng.permutation(len(tr_h)))
            losses = []
            for i in range(0, len(order), cfg.batch):
                idx = order[i : i + cfg.batch]
                h, t = tr_h[idx], tr_t[idx]
                h = h + cfg.noise * torch.randn_like(h)
                t = t + cfg.noise * torch.randn_like(t)
                loss = self.net.nll(h, t).mean()
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.net.parameters(), 5.0)
                opt.step()
                losses.append(loss.item())
            sched.step()
            epochs_done += 1
            train_nll = float(np.mean(losses))
            if len(va_h):
                val = float(self._nll(va_h, va_t).mean())
                if val < best_val:
                    best_val = val
                    best_state = {n: p.detach().clone() for n, p in self.net.state_dict().items()}
            if time.perf_counter() - start > cfg.max_train_s:
                break
        if best_state is not None:
            self.net.load_state_dict(best_state)
        calib_h, calib_t = (va_h, va_t) if len(va_h) else (tr_h, tr_t)
        self.calibration_raw = self._nll(calib_h, calib_t)
        self.calibration = self._smooth(self.calibration_raw)
        self.report = FitReport(epochs_done, time.perf_counter() - start, train_nll, best_val, len(hist))
        return self.report

    @torch.no_grad()
    def _nll(self, hist: torch.Tensor, tgt: torch.Tensor, chunk: int = 8192) -> Array:
        assert self.net is not None
        self.net.eval()
        out = [self.net.nll(hist[i : i + chunk], tgt[i : i + chunk]) for i in range(0, len(hist), chunk)]
        return torch.cat(out).numpy().astype(np.float32)

    def _smooth(self, s: Array) -> Array:
        return smooth_scores(s, self.config.smooth, self.config.decay)

    def _windows(self, x: Array) -> tuple[torch.Tensor, torch.Tensor]:
        if self.scaler is None or self.net is None:
            raise RuntimeError("detector is not fitted: call fit() or load() first")
        hist, tgt = windows(self.scaler.transform(x), self.config.history, self.config.target)
        return torch.from_numpy(hist), torch.from_numpy(tgt)

    def window_nll(self, x: Array) -> Array:
        """Unsmoothed NLL of every complete window of `x`."""
        return self._nll(*self._windows(x))

    def score_windows(self, x: Array) -> Array:
        """One score per complete window of `x` (higher = more anomalous)."""
        return self._smooth(self.window_nll(x))

    def score(self, x: Array) -> Array:
        """One score per time step of `x` (T,), aligned with its labels."""
        return per_step(self.score_windows(x), len(x))

    @torch.no_grad()
    def attribute(self, x: Array, samples: int = 128) -> dict[str, float]:
        """Which KPIs make the newest window of `x` unlikely: each KPI's distance from what the
        flow expects given the history (conditional samples' mean, in units of their spread),
        as shares summing to 1. Sampling the model, rather than reading raw z-scores, credits
        a KPI only when it is off *for this context* (a busy CPU during a busy phase is not)."""
        hist, tgt = self._windows(x)
        assert self.net is not None
        h, t = hist[-1:], tgt[-1]
        draws = self.net.flow(self.net.context(h)).sample((samples,))[:, 0]  # (S, target*K)
        dev = ((t - draws.mean(0)).abs() / (draws.std(0) + 1e-3)).reshape(self.config.target, -1).sum(0)
        total = float(dev.sum()) or 1.0
        return {name: float(v) / total for name, v in zip(self.kpis, dev.tolist(), strict=True)}

    def save(self, path: str | Path) -> None:
        """One file: weights, scaler, config, KPI names and calibration scores."""
        if self.net is None or self.scaler is None:
            raise RuntimeError("detector is not fitted: nothing to save")
        meta = {
            "config": asdict(self.config),
            "kpis": self.kpis,
            "scaler": self.scaler.to_dict(),
            "report": asdict(self.report) if self.report else None,
        }
        torch.save(
            {
                "meta": json.dumps(meta),
                "state": self.net.state_dict(),
                "calibration": torch.from_numpy(self.calibration),
            },
            str(path),
        )

    @classmethod
    def load(cls, path: str | Path) -> FlowDetector:
        blob = torch.load(str(path), weights_only=True)
        meta = json.loads(blob["meta"])
        # Models saved before `decay` existed smoothed with equal weights.
        meta["config"].setdefault("decay", 0.0)
        det = cls(config=DetectorConfig(**meta["config"]), kpis=list(meta["kpis"]))
        det.scaler = Scaler.from_dict(meta["scaler"])
        det.net = _Net(len(det.kpis), det.config)
        det.net.load_state_dict(blob["state"])
        det.net.eval()
        det.calibration = blob["calibration"].numpy()
        det.report = FitReport(**meta["report"]) if meta["report"] else None
        return det
