"""Would an *alarm budget* carry the flow's automatic threshold to 80 % of its best (issue 17)?

`scripts/threshold_ceiling.py` found that on the flow's target-4 scores (the default since
2026-11-26) flagging the same top 5 % of every server's whole test scores reaches 0.80 of the
best F1 — a rule no live monitor can run, as it needs the test period's scores in advance.
This script tries its causal counterparts: at each step the threshold is the (1 - p) quantile
of the newest `window` scores seen before it (the calibration scores filling in at the
start), never below the calibration scores' `floor` quantile. So at most about a share p of
a node's steps alarm, wherever its score level sits. p, window and floor are chosen by the
same leave-servers-out protocol as `sluice health eval --protocol leave-servers-out` (K = 3,
chosen on the other folds' servers by mean F1, reported on the held-out fold), per seed:

    .venv/bin/python scripts/health_budget_check.py ../shared/data/anomaly/asd CACHE [--seeds 0,1,2,3,4]

CACHE: the `--cache` of the protocol or of `scripts/health_model_protocol.py` (the shipped
detector's scores per seed are read from it, or trained and written there). Scores are
smoothed over 5 windows with equal weights (the protocol's choice in two of three folds).
"""

from __future__ import annotations

import argparse
import collections
import itertools
from pathlib import Path

import numpy as np

from sluice.health.detector import DetectorConfig, smooth_scores
from sluice.health.evaluation import load_folder
from sluice.health.features import per_step
from sluice.health.metrics import best_f1, f1_of
from sluice.health.protocol import FLOW, ScoreCache, folds, raw_scores

Rule = tuple[float, int, float]
"""(p: the share of steps that may alarm, window: how many newest scores the quantile is
over, floor: the calibration quantile the threshold never goes below, 0 = none)."""

RULES: list[Rule] = list(itertools.product((0.02, 0.03, 0.05, 0.08), (2000, 5000, 100_000), (0.0, 0.9, 0.95, 0.98)))
REFRESH = 50
"""Steps between two recomputations of the quantile (a sort of up to `window` scores)."""


def budget_alarms(calib: np.ndarray, test: np.ndarray, rule: Rule) -> np.ndarray:
    """The alarms of one rule over a server's test scores, each judged by scores before it only."""
    p, window, floor_q = rule
    floor = float(np.quantile(calib, floor_q)) if floor_q > 0 else -np.inf
    recent: collections.deque[float] = collections.deque(calib[-window:].tolist(), maxlen=window)
    out = np.zeros(len(test), dtype=bool)
    threshold = np.inf
    for t, x in enumerate(test):
        if t % REFRESH == 0:
            threshold = max(floor, float(np.quantile(np.fromiter(recent, float), 1 - p)))
        out[t] = x > threshold
        recent.append(float(x))
    return out


def one_seed(folder: Path, store: ScoreCache, seed: int) -> tuple[float, float]:
    """Held-out mean automatic F1 and mean best F1 over every server, for one seed."""
    data: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for ent in load_folder(folder):
        raw = raw_scores(ent, FLOW, DetectorConfig(seed=seed), store, folder / f"{ent.name}.npz")
        calib = np.asarray(smooth_scores(raw.calibration, 5, 0.0), dtype=float)
        test = np.nan_to_num(np.asarray(per_step(smooth_scores(raw.test, 5, 0.0), len(raw.label)), dtype=float))
        data[ent.name] = (calib[np.isfinite(calib)], test, raw.label)
    names = list(data)
    best = {n: best_f1(t, y)[0] for n, (_, t, y) in data.items()}
    f1 = {r: {n: f1_of(budget_alarms(c, t, r), y) for n, (c, t, y) in data.items()} for r in RULES}
    held: dict[str, float] = {}
    for fold in folds(names, 3):
        choosing = [n for n in names if n not in fold]
        rule = max(RULES, key=lambda r: (float(np.mean([f1[r][n] for n in choosing])), -RULES.index(r)))
        held |= {n: f1[rule][n] for n in fold}
        print(f"  seed {seed} held out {','.join(fold)}: chose p={rule[0]} window={rule[1]} floor={rule[2]}")
    auto, top = float(np.mean([held[n] for n in names])), float(np.mean(list(best.values())))
    print(f"seed {seed}: held-out automatic F1 {auto:.3f}, best F1 {top:.3f}, automatic/best {auto / top:.2f}")
    return auto, top


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("cache", type=Path)
    ap.add_argument("--seeds", default="0")
    a = ap.parse_args()
    store = ScoreCache(a.cache)
    runs = [one_seed(a.folder, store, int(s)) for s in a.seeds.split(",")]
    auto, top = np.mean([r[0] for r in runs]), np.mean([r[1] for r in runs])
    print(f"mean over {len(runs)} seed(s): automatic F1 {auto:.3f}, best F1 {top:.3f}, automatic/best {auto / top:.2f}")


if __name__ == "__main__":
    main()
