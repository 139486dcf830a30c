"""Would an ensemble of the flow with a baseline detector bring the automatic threshold
closer to the best one on ASD (issue 17)? Run under the same leave-servers-out protocol as
`sluice health eval --protocol leave-servers-out`, from the same cached raw scores:

    .venv/bin/python scripts/health_ensemble_check.py ../shared/data/anomaly/asd CACHE_DIR [mean|max]

Each member's scores (the flow's smoothed with one of three (smooth, decay) pairs) are put on
one scale per server from its own healthy calibration scores — (x − median) / (99th
percentile − median) — and combined by their mean or their max; the combined score then
goes through the baselines' threshold grid, chosen per fold on the other folds' servers. The
flow and the autoencoder alone are printed first for reference. Result (2026-11-25): no
combination beat the flow alone on held-out automatic F1 (docs/health.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from sluice.health.detector import DetectorConfig, smooth_scores
from sluice.health.evaluation import load_folder
from sluice.health.features import per_step
from sluice.health.protocol import (
    FLOW,
    RawScores,
    ScoreCache,
    baseline_settings,
    grid,
    leave_servers_out,
    raw_scores,
    summary,
)


def on_calibration_scale(calib: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(calib, dtype=np.float64)
    healthy = c[np.isfinite(c)]
    med, hi = float(np.median(healthy)), float(np.quantile(healthy, 0.99))
    span = max(hi - med, 1e-9)
    return (c - med) / span, (np.asarray(test, dtype=np.float64) - med) / span


def combined(raws: dict[str, RawScores], how: str, smooth: int, decay: float) -> RawScores:
    calibs, tests = [], []
    for r in raws.values():
        if r.smoothable:
            c = smooth_scores(r.calibration, smooth, decay)
            t = per_step(smooth_scores(r.test, smooth, decay), len(r.label))
        else:
            c, t = r.calibration, r.test
        t = np.nan_to_num(np.asarray(t, dtype=np.float64), nan=0.0, posinf=1e12, neginf=-1e12)
        c, t = on_calibration_scale(c, t)
        calibs.append(c)
        tests.append(t)
    n = min(len(c) for c in calibs)  # window NLLs and per-step scores differ in length
    stack_c, stack_t = np.stack([c[-n:] for c in calibs]), np.stack(tests)
    pick = np.max if how == "max" else np.mean
    first = next(iter(raws.values()))
    return RawScores(first.entity, "ensemble", pick(stack_c, axis=0), pick(stack_t, axis=0), first.label, 0.0)


def main() -> None:
    folder, cache = Path(sys.argv[1]), ScoreCache(Path(sys.argv[2]))
    how = sys.argv[3] if len(sys.argv) > 3 else "mean"
    ents = list(load_folder(folder, None))
    dets = (FLOW, "autoencoder", "pca")
    raws = {
        d: {e.name: raw_scores(e, d, DetectorConfig(), cache, folder / f"{e.name}.npz") for e in ents} for d in dets
    }
    flow_grid = grid()
    base_grid = baseline_settings(flow_grid)
    alone = leave_servers_out(
        {FLOW: raws[FLOW], "autoencoder": raws["autoencoder"]}, {FLOW: flow_grid, "autoencoder": base_grid}, 3
    )
    for det, v in summary(alone).items():
        print(f"{det:>32} alone: " + ", ".join(f"{k} {x:.3f}" for k, x in v.items()))
    for members in ((FLOW, "autoencoder"), (FLOW, "pca"), (FLOW, "autoencoder", "pca")):
        for smooth, decay in ((5, 0.7), (5, 0.0), (1, 0.0)):
            ens = {e.name: combined({d: raws[d][e.name] for d in members}, how, smooth, decay) for e in ents}
            v = summary(leave_servers_out({"ensemble": ens}, {"ensemble": base_grid}, 3))["ensemble"]
            label = f"{how}({'+'.join(members)}) smooth={smooth} decay={decay:g}"
            print(f"{label:>60}: " + ", ".join(f"{k} {x:.3f}" for k, x in v.items()))


if __name__ == "__main__":
    main()
