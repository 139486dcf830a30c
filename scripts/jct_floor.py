"""A floor under the average JCT any policy can reach on the Pollux workloads.

Why: at 0.5× load the cluster is mostly idle and every elastic policy runs close to what the
jobs could do alone, so "≤ 0.9× our pollux" may not exist to be won. This computes, from the
simulator's job models (the ground truth, used here only to bound, never by a policy), each
job's JCT if it had the whole 64-GPU cluster to itself from the moment it arrived: one start
(the simulator's restart penalty), then every epoch at the consolidated allocation with the
best goodput for that epoch, changed for free between epochs. No queueing, no exploration,
no restarts beyond the first. The mean over a workload's jobs is a floor: no policy in the
simulator can beat it.

    PYTHONPATH=src python scripts/jct_floor.py [--loads 0.5,1.0] [--workloads 1,...,8] [--pollux-dir DIR]

Prints, per load, the mean floor and the floor per workload in hours (compare with the
per-workload JCTs of `scripts/sweep_learned_curve.py`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sluice.control.simulate import build_model
from sluice.sim.apps import RESTART_PENALTY_S
from sluice.sim.jobs import GpuAppJob
from sluice.sim.workload import load_workload

GPUS_PER_NODE = 4
NODES = 16


def consolidated(k: int) -> tuple[int, ...]:
    """k GPUs on as few nodes as possible (the placement with the least communication)."""
    full, rest = divmod(k, GPUS_PER_NODE)
    return tuple([GPUS_PER_NODE] * full + ([rest] if rest else []))


def alone_s(job: GpuAppJob) -> float:
    """Seconds to finish with the cluster to itself, the best allocation each epoch."""
    app = job.app
    total = RESTART_PENALTY_S
    most = min(job.max_gpus, GPUS_PER_NODE * NODES)
    for epoch in range(app.max_epochs):
        job.epoch = epoch
        work = app.progress_at(epoch + 1) - app.progress_at(epoch)  # epoch e: from e to e+1 epochs done
        best = max(job.rate(consolidated(k)) for k in range(1, most + 1))
        total += work / best
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", default="0.5,1.0,1.5,2.0")
    ap.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--pollux-dir", default="../shared/data/pollux")
    ap.add_argument("--traces-dir", default="src/sluice/sim/models")
    a = ap.parse_args()
    base = Path(a.pollux_dir)
    ws = [int(w) for w in a.workloads.split(",")]
    for load in a.loads.split(","):
        folder = "workloads" if float(load) == 1.0 else f"workloads-{load}"
        row = []
        for w in ws:
            jobs = load_workload(base / folder / f"workload-{w}.csv")
            times = []
            for j in jobs:
                m = build_model(j, True, Path(a.traces_dir))
                assert isinstance(m, GpuAppJob)
                times.append(alone_s(m))
            row.append(sum(times) / len(times) / 3600)
        print(f"load {load}: floor mean {sum(row) / len(row):.3f} h; per workload " + " ".join(f"{x:.3f}" for x in row))


if __name__ == "__main__":
    main()
