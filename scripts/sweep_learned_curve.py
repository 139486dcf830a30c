"""The sweeps behind the learned-curve settings in docs/policies.md (not a product command).

    PYTHONPATH=src python scripts/sweep_learned_curve.py sluice 1,2 STALE_S=900.0
    WL=workloads-0.5 PYTHONPATH=src python scripts/sweep_learned_curve.py sluice 1,2,3 EXPLORE_FACTOR=4

Arguments: policy, comma-separated Pollux workload numbers, then NAME=VALUE overrides: a
constant of `policy/parts/speedup.py` or `policy/parts/elastic.py`, else a policy option
(e.g. alpha=2.0, change_margin=0.05). Prints the mean average JCT (hours), per workload, and
restarts. Needs the Pollux workloads (SLUICE_POLLUX_DATA, default ../shared/data/pollux).

GNS_ERROR=s (e.g. 0.3) multiplies every gradient noise scale a simulated job reports by a
random log-normal factor exp(N(0, s)) (seeded): the simulator reports the exact noise scale,
a real job's estimate (`sdk.GradientNoiseScale`) is noisy. CARRY_ALL=1 carries every policy's
learned curves to the reported noise scale (`sluice` alone has it as an option, carry_noise=1);
NOISE_WEIGHT (model/progress.py) = 1.0 takes each report's noise scale unsmoothed.
"""

from __future__ import annotations

import os
import random
import sys

import sluice.model.progress as progress
import sluice.policy.parts.elastic as elastic
import sluice.policy.parts.speedup as speedup
from sluice.control.simulate import SimConfig, pollux_data_dir, run_simulation
from sluice.sim.workload import load_workload


def main(argv: list[str]) -> None:
    policy, workloads = argv[0], [int(x) for x in argv[1].split(",")]
    options: dict[str, float | str] = {}
    for kv in argv[2:]:
        k, v = kv.split("=")
        if k == "GNS_ERROR":
            perturb_noise_scale(float(v))
            continue
        if k == "CARRY_ALL":  # every policy's learned curves carried to the noise scale
            elastic.Speedups.__init__.__defaults__ = (True, bool(int(v)))
            continue
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
        elif hasattr(progress, k):
            setattr(progress, k, value)
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


def perturb_noise_scale(sigma: float) -> None:
    from sluice.sim.jobs import GpuAppJob

    rng = random.Random(0)
    exact = GpuAppJob.noise_metrics

    def noisy(self: GpuAppJob) -> dict[str, float]:
        out = exact(self)
        if "grad_noise_scale" in out:
            out["grad_noise_scale"] *= rng.lognormvariate(0.0, sigma)
        return out

    GpuAppJob.noise_metrics = noisy  # type: ignore[method-assign]


if __name__ == "__main__":
    main(sys.argv[1:])
