"""Scores of an anomaly detector against labels, the way papers and operators read them.

Point adjustment (a whole labelled segment counts as found if any point in it is flagged)
inflates F1 — random scores reach a high point-adjusted F1 on long segments — so the
point-wise F1, AUROC and AUPRC are reported beside it. PA%K (Kim et al., AAAI'22) only
adjusts a segment when at least K % of its points are flagged.

Both adjustments are computed exactly without a threshold loop: adjusting a segment at
threshold t is the same as raising every score in it to the segment's max (PA) or to its
ceil(K%·len)-th largest score (PA%K) and thresholding the result, so the best F1 over all
thresholds is read off one precision-recall curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score


def segments(labels: NDArray[np.integer]) -> list[tuple[int, int]]:
    """[start, end) of every run of 1s."""
    y = np.asarray(labels).astype(np.int8).ravel()
    d = np.diff(np.concatenate([[0], y, [0]]))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


def adjust(scores: NDArray[np.floating], labels: NDArray[np.integer], k_percent: float = 0.0) -> NDArray[np.float64]:
    """Scores with each labelled segment raised to the level at which it counts as found.
    k_percent = 0 is plain point adjustment."""
    s = np.asarray(scores, dtype=np.float64).copy()
    for a, b in segments(labels):
        seg = s[a:b]
        need = max(1, math.ceil(k_percent / 100.0 * (b - a))) if k_percent > 0 else 1
        level = np.sort(seg)[::-1][need - 1]
        s[a:b] = np.maximum(seg, level)
    return s


def best_f1(scores: NDArray[np.floating], labels: NDArray[np.integer]) -> tuple[float, float]:
    """Best F1 over all thresholds, and the threshold reaching it."""
    y = np.asarray(labels).astype(int).ravel()
    if y.sum() == 0:
        return float("nan"), float("nan")
    p, r, t = precision_recall_curve(y, scores)
    f = 2 * p * r / np.maximum(p + r, 1e-12)
    i = int(np.argmax(f[:-1])) if len(t) else 0
    return float(f[i]), float(t[i]) if len(t) else float("nan")


def f1_at(scores: NDArray[np.floating], labels: NDArray[np.integer], threshold: float) -> float:
    y = np.asarray(labels).astype(bool).ravel()
    pred = np.asarray(scores) >= threshold
    tp = float(np.sum(pred & y))
    denom = float(pred.sum() + y.sum())
    return 2 * tp / denom if denom else 0.0


@dataclass
class Scores:
    f1_best: float
    f1_spot: float
    f1_pa: float
    f1_pak: float
    auroc: float
    auprc: float
    f1_dspot: float = float("nan")
    """Point-wise F1 of drift-aware SPOT's alarms (`spot.dspot_alarms`), the automatic
    threshold that follows the score level online."""


def f1_of(alarms: NDArray[np.bool_], labels: NDArray[np.integer]) -> float:
    """Point-wise F1 of a given set of alarms."""
    y = np.asarray(labels).astype(bool).ravel()
    pred = np.asarray(alarms).astype(bool).ravel()
    denom = float(pred.sum() + y.sum())
    return 2 * float(np.sum(pred & y)) / denom if denom else 0.0


def evaluate_scores(
    scores: NDArray[np.floating],
    labels: NDArray[np.integer],
    spot_threshold: float | None,
    k_percent: float = 20.0,
    alarms: NDArray[np.bool_] | None = None,
) -> Scores:
    """Every metric of `scores` against `labels`; `spot_threshold`: SPOT's fixed threshold
    (f1_spot); `alarms`: a streaming threshold's alarms, one per score (f1_dspot). Where the
    labels hold no anomaly (a node no fault was injected on) no F1 is defined, the automatic
    thresholds' included: NaN, skipped by the means, not a 0 next to a best F1 that is
    itself undefined."""
    y = np.asarray(labels).astype(int).ravel()
    s = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=0.0, posinf=1e12, neginf=-1e12)
    both = 0 < y.sum() < len(y)
    spot_f1 = float("nan")
    if spot_threshold is not None and y.any():
        spot_f1 = f1_at(s, y, spot_threshold)
    return Scores(
        f1_best=best_f1(s, y)[0],
        f1_spot=spot_f1,
        f1_pa=best_f1(adjust(s, y), y)[0],
        f1_pak=best_f1(adjust(s, y, k_percent), y)[0],
        auroc=float(roc_auc_score(y, s)) if both else float("nan"),
        auprc=float(average_precision_score(y, s)) if both else float("nan"),
        f1_dspot=f1_of(alarms, y) if alarms is not None and y.any() else float("nan"),
    )
