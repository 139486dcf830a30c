"""Offline evaluation: every contender on every entity of a labelled folder, side by side.

A folder holds NAME.npz files with `train` (T×K), `test` (T'×K) and `test_label` (T',
0/1) — the format of shared/data/anomaly/asd; any folder in that format works. Each
contender is fitted on `train` only (it never sees a label), scores `test`, and gets a SPOT
threshold from scores on held-out healthy data.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sluice.health.baselines import AutoencoderDetector, Detector, IForestDetector, PCADetector
from sluice.health.detector import DetectorConfig, FlowDetector
from sluice.health.metrics import Scores, evaluate_scores
from sluice.health.spot import Spot, dspot_alarms


class DatasetError(ValueError):
    """A file of the evaluation folder is not in the expected format (message names it)."""


@dataclass
class Entity:
    name: str
    train: np.ndarray
    test: np.ndarray
    label: np.ndarray


def load_folder(folder: str | Path, only: list[str] | None = None) -> Iterator[Entity]:
    """Entities of a folder, in natural order (omi-2 before omi-10)."""
    root = Path(folder)
    if not root.is_dir():
        raise DatasetError(f"{root}: not a folder")
    files = sorted(root.glob("*.npz"), key=lambda p: _natural(p.stem))
    if only:
        files = [f for f in files if f.stem in only]
    if not files:
        raise DatasetError(f"{root}: no .npz files" + (f" named {', '.join(only)}" if only else ""))
    for f in files:
        with np.load(f, allow_pickle=False) as d:
            missing = [k for k in ("train", "test", "test_label") if k not in d]
            if missing:
                raise DatasetError(f"{f.name}: missing array(s) {', '.join(missing)}")
            train = np.asarray(d["train"], dtype=np.float32)
            test = np.asarray(d["test"], dtype=np.float32)
            label = np.asarray(d["test_label"]).astype(np.int8).ravel()
        if train.ndim != 2 or test.ndim != 2 or train.shape[1] != test.shape[1]:
            raise DatasetError(f"{f.name}: train {train.shape} and test {test.shape} must be T×K with the same K")
        if len(label) != len(test):
            raise DatasetError(f"{f.name}: test_label has {len(label)} values, test has {len(test)} rows")
        yield Entity(f.stem, train, test, label)


def _natural(s: str) -> list[object]:
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def contenders(flow: DetectorConfig | None = None, baselines: bool = True) -> dict[str, Callable[[], Detector]]:
    out: dict[str, Callable[[], Detector]] = {"sluice-flow": lambda: _Named(FlowDetector(flow or DetectorConfig()))}
    if baselines:
        out.update(pca=PCADetector, iforest=IForestDetector, autoencoder=AutoencoderDetector)
    return out


class _Named:
    """Gives the flow detector the baselines' `name` attribute."""

    name = "sluice-flow"

    def __init__(self, det: FlowDetector) -> None:
        self.det = det

    @property
    def calibration(self) -> np.ndarray:
        return self.det.calibration

    def fit(self, train: np.ndarray) -> object:
        return self.det.fit(train)

    def score(self, x: np.ndarray) -> np.ndarray:
        return self.det.score(x)


@dataclass
class EvaluationRow:
    entity: str
    detector: str
    scores: Scores
    train_s: float
    windows_per_s: float

    def as_dict(self) -> dict[str, object]:
        return {
            "entity": self.entity,
            "detector": self.detector,
            **asdict(self.scores),
            "train_s": self.train_s,
            "windows_per_s": self.windows_per_s,
        }


EVAL_Q = 1e-2
"""SPOT's risk in the offline evaluation when none is given (`--q`): what the leave-servers-out
protocol chose on ASD in every fold (docs/health.md; K = 3), for data sluice has not seen. The
live monitor keeps 1e-3 (a sample a second, not one per 5 minutes)."""
EVAL_DSPOT_DEPTH = 10
"""Drift-aware SPOT's depth there (`--dspot-depth`): what the protocol chose most on the flow's
window-of-4 scores (2026-11-27: in 13 of 15 folds over seeds 0-4; 100 was its choice on the
one-step scores before). The live monitor keeps 100."""
EVAL_SMOOTH = 8
"""The flow's score smoothing there (`--smooth`): chosen in 9 of those 15 folds (5 and 1 in three each)."""
EVAL_DECAY = 0.7
"""The newest window's weight in it (`--decay`; 0 = equal weights): chosen in 12 of 15 folds."""


def evaluate_entity(
    ent: Entity, name: str, make: Callable[[], Detector], q: float = EVAL_Q, dspot_depth: int = EVAL_DSPOT_DEPTH
) -> EvaluationRow:
    det = make()
    t0 = time.perf_counter()
    det.fit(ent.train)
    train_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    s = det.score(ent.test)
    speed = len(ent.test) / max(time.perf_counter() - t1, 1e-9)
    thr = Spot(q=q).fit(det.calibration).threshold if len(det.calibration) else None
    alarms = dspot_alarms(det.calibration, s, q=q, depth=dspot_depth) if len(det.calibration) > 3 else None
    return EvaluationRow(ent.name, name, evaluate_scores(s, ent.label, thr, alarms=alarms), train_s, speed)


METRICS = ("f1_best", "f1_spot", "f1_dspot", "f1_pa", "f1_pak", "auroc", "auprc", "train_s", "windows_per_s")


def average(rows: list[EvaluationRow]) -> dict[str, dict[str, float]]:
    """Mean of every metric per detector (NaNs, e.g. an entity with no anomaly, skipped)."""
    out: dict[str, dict[str, float]] = {}
    for det in dict.fromkeys(r.detector for r in rows):
        mine = [r.as_dict() for r in rows if r.detector == det]
        out[det] = {m: float(np.nanmean([float(d[m]) for d in mine])) for m in METRICS}  # type: ignore[arg-type]
    return out
