"""The threshold-rule variants behind docs/benchmarks.md ("The two rules on every recorded
campaign") and docs/health.md ("Drift-aware thresholds"), not a product command.

    .venv/bin/python scripts/threshold_rule_sweep.py replay campaign12.trace.jsonl campaign13.trace.jsonl ...
    .venv/bin/python scripts/threshold_rule_sweep.py asd ../shared/data/anomaly/asd CACHE_DIR

`replay`: each trace through `sluice bench health --replay`'s monitor under SPOT and DSPOT at
several depths and risks; prints per variant the faults cordoned within 60 s, false cordons
and the alarms counted on nodes without a fault (summed over the traces).
`asd`: the live monitor's rule (`protocol.apply_live`) on ASD's flow scores (read from, or
written to, the `--cache` of `sluice health eval --protocol leave-servers-out`), under SPOT
and DSPOT.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from sluice.health.monitor import MACHINE_WIDE, MonitorConfig

VARIANTS: tuple[tuple[str, int, float], ...] = (
    ("spot", 100, 1e-3),
    ("dspot", 30, 1e-3),
    ("dspot", 100, 1e-3),
    ("dspot", 300, 1e-3),
    ("dspot", 100, 1e-2),
)


def replays(traces: list[Path]) -> None:
    from sluice.bench.health_replay import replay

    for rule, depth, q in VARIANTS:
        cfg = MonitorConfig(ignore=("jobs", *MACHINE_WIDE), threshold=rule, dspot_depth=depth, q=q)
        caught = judged = false = alarms = 0
        for t in traces:
            r = replay(t, config=cfg)
            caught, judged = caught + r.caught, judged + len(r.judged)
            false, alarms = false + len(r.false_cordons), alarms + sum(r.false_alarms.values())
        label = rule if rule == "spot" else f"dspot depth {depth}"
        print(
            f"{label:>16} q={q:g}: {caught}/{judged} cordoned within 60 s, {false} false cordons, "
            f"{alarms} alarms on nodes without a fault"
        )


def asd(folder: Path, cache: Path) -> None:
    from sluice.health.detector import DetectorConfig
    from sluice.health.evaluation import load_folder
    from sluice.health.protocol import FLOW, ScoreCache, apply_live, raw_scores

    store = ScoreCache(cache)
    raws = [raw_scores(e, FLOW, DetectorConfig(), store, folder / f"{e.name}.npz") for e in load_folder(folder)]
    for rule in ("spot", "dspot"):
        outs = [apply_live(r, MonitorConfig(threshold=rule)) for r in raws]
        b, a = np.nanmean([o.f1_best for o in outs]), np.nanmean([o.f1_auto for o in outs])
        print(
            f"live rule, bounded {rule}: F1 best {b:.3f}, auto {a:.3f}, {a / b:.2f} of best, "
            f"precision {np.nanmean([o.precision for o in outs]):.3f}, "
            f"recall {np.nanmean([o.recall for o in outs]):.3f}"
        )


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "replay":
        replays([Path(a) for a in sys.argv[2:]])
    elif len(sys.argv) == 4 and sys.argv[1] == "asd":
        asd(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
