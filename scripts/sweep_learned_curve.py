"""The sweeps behind the learned-curve settings in docs/policies.md (not a product command).

    PYTHONPATH=src python scripts/sweep_learned_curve.py sluice 1,2 STALE_S=900.0
    WL=workloads-0.5 PYTHONPATH=src python scripts/sweep_learned_curve.py sluice 1,2,3 EXPLORE_FACTOR=4

Arguments: policy, comma-separated Pollux workload numbers, then NAME=VALUE overrides: a
constant of `policy/parts/speedup.py` or `policy/parts/elastic.py`, else a policy option
(e.g. alpha=2.0, change_margin=0.05). Prints the mean average JCT (hours), per workload, and
restarts. Needs the Pollux workloads (SLUICE_POLLUX_DATA, default ../shared/data/pollux).
"""

from __future__ import annotations

import os
import sys

import sluice.policy.parts.elastic as elastic
import sluice.policy.parts.speedup as speedup
from sluice.control.simulate import SimConfig, pollux_data_dir, run_simulation
from sluice.sim.workload import load_workload


def main(argv: list[str]) -> None:
    policy, workloads = argv[0], [int(x) for x in argv[1].split(",")]
    options: dict[str, float | str] = {}
    for kv in argv[2:]:
        k, v = kv.split("=")
        value: float | str
        try:
            value = int(v)
        except ValueError:
            try:
                value = float(v)
            except ValueError:
                value = v
        if hasattr(speedup, k):
            setattr(speedup, k, value)
        elif hasattr(elastic, k):
            setattr(elastic, k, value)
        else:
            options[k] = value
    folder = pollux_data_dir() / os.environ.get("WL", "workloads")
    jcts, restarts = [], 0
    for w in workloads:
        cfg = SimConfig(nodes=16, gpus_per_node=4, interval_s=60.0, policy_options=options)
        res = run_simulation(load_workload(folder / f"workload-{w}.csv"), policy, cfg)
        jcts.append(res.avg_jct_s / 3600)
        restarts += res.restarts
    per = " ".join(f"{x:.3f}" for x in jcts)
    print(f"{policy} {argv[2:]} mean {sum(jcts) / len(jcts):.3f} h  per workload {per}  restarts {restarts}")


if __name__ == "__main__":
    main(sys.argv[1:])
