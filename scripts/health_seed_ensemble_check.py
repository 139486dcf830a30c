"""Does averaging the window NLLs of flows trained with different seeds give better-ordered,
better-transferring scores on ASD (issue 17)? Same leave-servers-out protocol and grid as
`sluice health eval --protocol leave-servers-out`, from (or into) the same `--cache`:

    .venv/bin/python scripts/health_seed_ensemble_check.py ../shared/data/anomaly/asd CACHE_DIR [SEEDS] [K]

SEEDS: comma-separated (default 0,1,2). Prints each seed alone, then the mean of the seeds'
raw window NLLs (calibration and test), each through the 80-setting grid.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from sluice.health.detector import DetectorConfig
from sluice.health.evaluation import load_folder
from sluice.health.protocol import FLOW, RawScores, ScoreCache, grid, leave_servers_out, raw_scores, summary


def report(label: str, raws: dict[str, RawScores], k: int) -> None:
    res = leave_servers_out({label: raws}, {label: grid()}, k)
    for r in res:
        print(
            f"  {label} fold {r.fold}: {r.setting.label()}; chosen-on {r.chosen_on:.3f}; held-out best "
            f"{r.mean('f1_best'):.3f} auto {r.mean('f1_auto'):.3f} ratio {r.mean('f1_auto') / r.mean('f1_best'):.2f}"
        )
    s = summary(res)[label]
    print(
        f"{label} K={k}: F1 best {s['f1_best']:.3f} auto {s['f1_auto']:.3f} ratio {s['ratio']:.2f} "
        f"P {s['precision']:.3f} R {s['recall']:.3f}",
        flush=True,
    )


def main() -> None:
    folder, cache = Path(sys.argv[1]), ScoreCache(Path(sys.argv[2]))
    seeds = [int(s) for s in (sys.argv[3] if len(sys.argv) > 3 else "0,1,2").split(",")]
    k = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    ents = list(load_folder(folder))
    per_seed = {
        s: {e.name: raw_scores(e, FLOW, DetectorConfig(seed=s), cache, folder / f"{e.name}.npz") for e in ents}
        for s in seeds
    }
    for s, raws in per_seed.items():
        report(f"seed {s}", raws, k)
    mean = {
        e.name: RawScores(
            e.name,
            FLOW,
            np.mean([per_seed[s][e.name].calibration for s in seeds], axis=0),
            np.mean([per_seed[s][e.name].test for s in seeds], axis=0),
            e.label,
            0.0,
        )
        for e in ents
    }
    report(f"mean of seeds {','.join(map(str, seeds))}", mean, k)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main()
