"""What measuring each job's restart cost does in the Pollux simulator (docs/policies.md,
"Restart cost: measured per job"; docs/benchmarks.md):

    .venv/bin/python scripts/sim_restart_cost.py ../shared/data/pollux

1. Every restart cost the trackers measured for `sluice` on workload 3 at 1.0x (the simulator
   charges exactly 30 s each), as percentiles.
2. `sluice`'s average JCT against the better of `pollux` and `pollux-prior` on a few
   (load, workload) pairs: the per-workload ratios the goal counts. Run it on two commits to
   compare them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from sluice.bench.sim import VARIANTS
from sluice.control.simulate import SimConfig, load_workload, run_simulation
from sluice.model import ProgressTracker

PAIRS = (("1.0", 3), ("0.5", 3), ("0.5", 5), ("0.5", 6), ("1.5", 3), ("2.0", 3))


def workload(base: Path, load: str, w: int) -> Path:
    return base / ("workloads" if load == "1.0" else f"workloads-{load}") / f"workload-{w}.csv"


def avg_jct(base: Path, policy: str, load: str, w: int) -> float:
    name, options = VARIANTS.get(policy, (policy, {}))
    cfg = SimConfig(nodes=16, gpus_per_node=4, interval_s=60.0, policy_options=options)
    return run_simulation(load_workload(workload(base, load, w)), name, cfg).avg_jct_s


def measured_costs(base: Path) -> list[float]:
    """Run sluice on w3 at 1.0x, keeping every tracker the controller marks as restarting."""
    if not hasattr(ProgressTracker, "restarting"):
        return []  # a commit from before restart costs were measured
    seen: list[ProgressTracker] = []
    original = ProgressTracker.restarting

    def keep(self: ProgressTracker) -> None:
        if self not in seen:
            seen.append(self)
        original(self)

    ProgressTracker.restarting = keep  # type: ignore[method-assign]
    try:
        avg_jct(base, "sluice", "1.0", 3)
    finally:
        ProgressTracker.restarting = original  # type: ignore[method-assign]
    return [c for tr in seen for c in tr.snapshot().restart_lost_s]


def main() -> None:
    base = Path(sys.argv[1])
    costs = np.asarray(measured_costs(base))
    if len(costs):
        pct = np.percentile(costs, [5, 25, 50, 75, 95]).round(1)
        print(f"w3 at 1.0x, sluice: {len(costs)} restarts measured (last 8 per job kept); p5/25/50/75/95 {pct}")
    for load, w in PAIRS:
        jct = {p: avg_jct(base, p, load, w) for p in ("sluice", "pollux", "pollux-prior")}
        print(f"{load}x w{w}: sluice / best pollux {jct['sluice'] / min(jct['pollux'], jct['pollux-prior']):.3f}")


if __name__ == "__main__":
    main()
