"""Measured GPU training applications (the Pollux artifact's traces), as step-time and
statistical-efficiency models.

Why measured rather than fitted: the fidelity goal is to reproduce the Pollux paper's
published completion times, so the simulator uses the same measurements the paper's
simulator used — step time per placement (GPUs on each node) and per-GPU batch size,
and gradient statistics per epoch — and interpolates only where nothing was measured.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, cast

import numpy as np

EPOCHS: dict[str, int] = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
"""Epochs each application trains for (the Pollux artifact's settings)."""

MAX_LOCAL_BSZ: dict[str, int] = {"yolov3": 8}
"""Per-GPU batch ceilings that are tighter than the measured range (GPU memory)."""

RESTART_PENALTY_S = 30.0
"""Seconds a GPU job loses on every (re)start or change of allocation (checkpoint-restart)."""

SHIPPED_MODELS = Path(__file__).resolve().parent / "models"
"""The Pollux artifact's measured job models, shipped as package data (see models/SOURCE.md):
small, and without them no GPU job can be simulated."""

Placement = tuple[int, ...]
"""GPUs on each node the job uses, e.g. (4, 4, 2)."""


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class BatchConfig:
    """How a job runs one optimizer step: per-GPU micro-batch, accumulation steps, total batch."""

    atomic_bsz: int
    accum_steps: int
    replicas: int

    @property
    def batch_size(self) -> int:
        return self.atomic_bsz * self.replicas * (self.accum_steps + 1)


@dataclass
class Application:
    """One application's measurements. Every lookup is memoised: a simulated day asks the
    same few (placement, batch) questions millions of times."""

    name: str
    max_epochs: int
    placements: dict[Placement, tuple[np.ndarray, np.ndarray, np.ndarray]]
    """placement -> (local_bsz sorted, step_time, sync_time)."""
    points: np.ndarray
    """(num_nodes, num_replicas, local_bsz) rows of every measurement, for interpolation."""
    values: np.ndarray
    """(step_time, sync_time) rows matching `points`."""
    progress: np.ndarray
    """Cumulative progress (reference-batch steps) at the end of each epoch."""
    batch_sizes: np.ndarray
    """Batch sizes with a validation run, ascending."""
    grad_sqr: np.ndarray
    """(len(batch_sizes), epochs): gradient square norm measured in each run at each epoch."""
    grad_var: np.ndarray
    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int
    max_local_bsz: int
    _cache: dict[tuple[Placement, int], tuple[float, float]] = field(default_factory=dict, repr=False)
    _nd: object | None = field(default=None, repr=False)
    _stats: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict, repr=False)

    @property
    def total_progress(self) -> float:
        return float(self.progress[self.max_epochs - 1])

    def progress_at(self, epoch: int) -> float:
        """Progress needed to finish `epoch` epochs."""
        if epoch <= 0:
            return 0.0
        return float(self.progress[min(epoch, len(self.progress)) - 1])

    def gain(self, epoch: int, batch_size: int) -> float:
        """Statistical efficiency of batch B relative to B0 at this epoch:
        (var + sqr) / (var / (B / B0) + sqr)."""
        sqr, var = self.grad_stats(epoch, batch_size)
        scale = batch_size / self.init_batch_size
        return (var + sqr) / (var / scale + sqr)

    def grad_stats(self, epoch: int, batch_size: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) at this epoch, from the validation run at this batch size —
        interpolated in log(batch) between the measured runs, clamped at the ends. The
        statistics depend on the batch the job trains with, so a run at B0 alone would
        understate the efficiency of large batches."""
        key = (epoch, batch_size)
        hit = self._stats.get(key)
        if hit is not None:
            return hit
        e = min(max(epoch, 0), self.grad_sqr.shape[1] - 1)
        x = np.log(min(max(batch_size, self.batch_sizes[0]), self.batch_sizes[-1]))
        xs = np.log(self.batch_sizes)
        out = (float(np.interp(x, xs, self.grad_sqr[:, e])), float(np.interp(x, xs, self.grad_var[:, e])))
        self._stats[key] = out
        return out

    def step_time(self, placement: Placement, local_bsz: int) -> tuple[float, float]:
        """(step_time, sync_time) in seconds for one micro-batch step."""
        key = (placement, local_bsz)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        out = self._lookup(placement, local_bsz)
        self._cache[key] = out
        return out

    def _lookup(self, placement: Placement, local_bsz: int) -> tuple[float, float]:
        table = self.placements.get(placement)
        if table is None:
            table = self.placements.get(tuple(sorted(placement, reverse=True)))
        if table is None:
            table = self.placements.get(tuple(sorted(placement)))
        if table is not None:
            bs, st, sy = table
            return float(np.interp(local_bsz, bs, st)), float(np.interp(local_bsz, bs, sy))
        return self._interpolate(min(len(placement), 16), sum(placement), local_bsz)

    def _scaled(self, pts: np.ndarray) -> np.ndarray:
        """Coordinates on comparable scales: node and replica counts as they are, batch in log2."""
        out = np.array(pts, dtype=float)
        out[:, 2] = np.log2(np.maximum(out[:, 2], 1.0))
        return out

    def _interpolate(self, nodes: int, replicas: int, local_bsz: int) -> tuple[float, float]:
        from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator
        from scipy.spatial import Delaunay

        if self._nd is None:
            # Joggled triangulation: the points sit on an integer grid, and Qhull is slow
            # (tens of seconds) on such degenerate input without it.
            tri = Delaunay(self._scaled(self.points), qhull_options="QJ")
            self._nd = (
                LinearNDInterpolator(tri, self.values),
                NearestNDInterpolator(self._scaled(self.points), self.values),
            )
        lin, near = cast(tuple[Any, Any], self._nd)
        q = self._scaled(np.array([[nodes, replicas, local_bsz]], dtype=float))
        v = lin(q)[0]
        if not np.all(np.isfinite(v)):
            v = near(q)[0]
        return float(v[0]), float(v[1])

    # ------------------------------------------------------------- batch configurations

    def fixed_config(self, replicas: int, batch_size: int) -> BatchConfig:
        """The configuration a job with a fixed total batch runs on `replicas` GPUs: split
        the batch, accumulate gradients where a GPU cannot hold its share (Pollux's rule)."""
        local = math.ceil(batch_size / replicas - 1e-8)
        accum = math.ceil(local / self.max_local_bsz - 1e-8) - 1
        if replicas == 1 and batch_size > self.init_batch_size:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(self.max_batch_size / (replicas * (accum + 1))))
        return BatchConfig(max(1, atomic), accum, replicas)

    def iteration_time(self, placement: Placement, cfg: BatchConfig) -> float:
        """Seconds per optimizer step, accumulation included."""
        step, sync = self.step_time(placement, cfg.atomic_bsz)
        return step + (step - sync) * cfg.accum_steps

    def goodput(self, placement: Placement, cfg: BatchConfig, epoch: int) -> float:
        """Progress (reference-batch steps) per second."""
        return self.gain(epoch, cfg.batch_size) / self.iteration_time(placement, cfg)

    def best_config(self, placement: Placement, epoch: int) -> BatchConfig:
        """The goodput-maximising batch for this placement and epoch (what an adaptive-batch
        job, AdaptDL-style, would pick), searched over a small grid."""
        replicas = sum(placement)
        best: BatchConfig | None = None
        best_g = -1.0
        lo = max(self.min_local_bsz, math.ceil(self.init_batch_size / replicas))
        for atomic in _grid(min(lo, self.max_local_bsz), self.max_local_bsz):
            most = max(0, self.max_batch_size // max(atomic * replicas, 1) - 1)
            for accum in sorted({0, 1, 2, 3, most // 4, most // 2, most}):
                cfg = BatchConfig(atomic, accum, replicas)
                if accum > most and not (accum == 0 and best is None):
                    break
                g = self.goodput(placement, cfg, epoch)
                if g > best_g:
                    best, best_g = cfg, g
        assert best is not None
        return best


def _grid(lo: int, hi: int, points: int = 8) -> list[int]:
    if hi <= lo:
        return [lo]
    vals = np.unique(np.round(np.geomspace(lo, hi, points)).astype(int))
    return [int(v) for v in vals]


def load_application(traces_dir: Path, name: str) -> Application:
    """Read one application's CSVs from the Pollux traces folder."""
    base = traces_dir / name
    if not (base / "placements.csv").exists():
        raise FileNotFoundError(f"no measurements for application {name!r} under {base}")
    rows = _read_csv(base / "placements.csv")
    grouped: dict[Placement, list[tuple[int, float, float]]] = {}
    pts: list[tuple[float, float, float]] = []
    vals: list[tuple[float, float]] = []
    for r in rows:
        p = tuple(int(c) for c in r["placement"].strip())
        bs, st, sy = int(float(r["local_bsz"])), float(r["step_time"]), float(r["sync_time"])
        grouped.setdefault(p, []).append((bs, st, sy))
        pts.append((len(p), sum(p), bs))
        vals.append((st, sy))
    for r in _read_csv(base / "scalability.csv"):
        pts.append((float(r["num_nodes"]), float(r["num_replicas"]), float(r["local_bsz"])))
        vals.append((float(r["step_time"]), float(r["sync_time"])))
    # One point per (nodes, replicas, local batch), averaged: many placements share those
    # coordinates, and duplicate points make the triangulation degenerate and very slow.
    merged: dict[tuple[float, float, float], list[tuple[float, float]]] = {}
    for pt, v in zip(pts, vals, strict=True):
        merged.setdefault(pt, []).append(v)
    pts = list(merged)
    vals = [(float(np.mean([a for a, _ in vs])), float(np.mean([b for _, b in vs]))) for vs in merged.values()]
    tables: dict[Placement, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for p, items in grouped.items():
        agg: dict[int, list[tuple[float, float]]] = {}
        for bs, st, sy in items:
            agg.setdefault(bs, []).append((st, sy))
        keys = sorted(agg)
        tables[p] = (
            np.array(keys, dtype=float),
            np.array([np.mean([a for a, _ in agg[k]]) for k in keys]),
            np.array([np.mean([b for _, b in agg[k]]) for k in keys]),
        )
    validation = {int(f.stem.split("-")[-1]): f for f in base.glob("validation-*.csv")}
    b0 = min(validation)
    runs = {b: _read_csv(f) for b, f in sorted(validation.items())}
    vrows = runs[b0]
    epochs = min(len(r) for r in runs.values())
    local_sizes = [int(float(r["local_bsz"])) for r in rows]
    return Application(
        name=name,
        max_epochs=min(EPOCHS.get(name, len(vrows)), len(vrows)),
        placements=tables,
        points=np.array(pts, dtype=float),
        values=np.array(vals, dtype=float),
        progress=np.array([float(r["progress"]) for r in vrows]),
        batch_sizes=np.array(sorted(runs), dtype=float),
        grad_sqr=np.array([[float(r["grad_sqr"]) for r in rows_b[:epochs]] for rows_b in runs.values()]),
        grad_var=np.array([[float(r["grad_var"]) for r in rows_b[:epochs]] for rows_b in runs.values()]),
        init_batch_size=b0,
        max_batch_size=max(validation),
        min_local_bsz=min(local_sizes),
        max_local_bsz=MAX_LOCAL_BSZ.get(name, max(local_sizes)),
    )


@cache
def load_applications(traces_dir: str) -> dict[str, Application]:
    """Every application under the traces folder (cached per folder)."""
    base = Path(traces_dir)
    names = sorted(p.name for p in base.iterdir() if (p / "placements.csv").exists())
    return {n: load_application(base, n) for n in names}
