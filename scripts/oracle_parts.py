"""What each piece of the simulator's ground truth would be worth to a policy (a study, not a
product command; every figure it prints is an upper bound, never a result).

    WL=workloads-0.5 PYTHONPATH=src python scripts/oracle_parts.py sluice 1,2,3,4,5,6,7,8 speedup
    PYTHONPATH=src python scripts/oracle_parts.py sluice 1,2,3,4,5,6,7,8 all lookahead=all
    PYTHONPATH=src python scripts/oracle_parts.py pollux 1,2,3,4,5,6,7,8 speedup,remaining

Arguments: policy, comma-separated Pollux workload numbers, then the parts of the truth to
hand over, comma-separated (or `none`, or `all`), then policy options as NAME=VALUE:
- `speedup`: the job's true goodput curve (relative to its request, as the learned curve is),
  and with it no exploration cap: the policy may give the spec's maximum at once;
- `remaining`: the job's exact remaining work (converted to its requested GPUs with the true
  curve at that one point);
- `restart`: the exact restart cost (30 s in the simulator) instead of the measured one.
Everything not handed over is what the policy estimates in an observed run. `all` is
`sluice bench sim --oracle`. Prints the mean average JCT (hours), per workload, and restarts,
like `scripts/sweep_learned_curve.py`. Needs the Pollux workloads (SLUICE_POLLUX_DATA).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import sluice.policy.parts.elastic as elastic
from sluice.control.simulate import SimConfig, pollux_data_dir, run_simulation
from sluice.model import Allocation, Assignment, JobView
from sluice.policy.parts.gpu import max_gpus, requested_gpus
from sluice.sim.workload import load_workload

PARTS = ("speedup", "remaining", "restart")


def _observed(job: JobView) -> JobView:
    return dataclasses.replace(job, oracle=None)


def _true(job: JobView, n: int, per_node: int) -> float:
    assert job.oracle is not None and job.oracle.speedup is not None
    shape = elastic.shape(n, per_node)
    alloc = Allocation(tuple(Assignment(f"_{i}", gpus=g) for i, g in enumerate(shape)))
    return max(job.oracle.speedup(alloc), 1e-9)


def hand_over(parts: set[str]) -> None:
    """Patch `elastic` so that policies see the truth for `parts` only."""
    call, most, remaining, restart = (
        elastic.Speedups.__call__,
        elastic.Speedups.most,
        elastic.Speedups.remaining_ref_s,
        elastic.restart_s,
    )

    def knows(job: JobView) -> bool:
        return job.oracle is not None and job.oracle.speedup is not None

    def p_call(self: elastic.Speedups, job: JobView, n: int) -> float:
        if n <= 0:
            return 0.0
        if "speedup" in parts and knows(job):
            return max(_true(job, n, self.per_node) / _true(job, max(requested_gpus(job), 1), self.per_node), 1e-9)
        return call(self, _observed(job), n)

    def p_most(self: elastic.Speedups, job: JobView) -> int:
        if "speedup" in parts and knows(job):
            return max_gpus(job)
        return most(self, _observed(job))

    def p_remaining(self: elastic.Speedups, job: JobView) -> float:
        if "remaining" in parts and knows(job):
            assert job.oracle is not None
            at_ref = _true(job, max(job.oracle.ref_gpus, 1), self.per_node)
            at_req = _true(job, max(requested_gpus(job), 1), self.per_node)
            return max(job.oracle.remaining_ref_s * at_ref / at_req, 1.0)
        return remaining(self, _observed(job))

    def p_restart(job: JobView, default: float = elastic.DEFAULT_RESTART_S) -> float:
        if "restart" in parts and job.oracle is not None and job.oracle.restart_s is not None:
            return job.oracle.restart_s
        return restart(_observed(job), default)

    elastic.Speedups.__call__ = p_call  # type: ignore[method-assign]
    elastic.Speedups.most = p_most  # type: ignore[method-assign]
    elastic.Speedups.remaining_ref_s = p_remaining  # type: ignore[method-assign]
    elastic.restart_s = p_restart
    import sluice.policy.pollux as pollux
    import sluice.policy.sluice_policy as sluice_policy

    sluice_policy.restart_s = p_restart
    pollux.restart_s = p_restart


def _value(v: str) -> float | str:
    try:
        return float(v)
    except ValueError:
        return v


def main(argv: list[str]) -> None:
    policy, workloads = argv[0], [int(x) for x in argv[1].split(",")]
    spec = argv[2] if len(argv) > 2 else "none"
    parts = set(PARTS) if spec == "all" else set() if spec == "none" else set(spec.split(","))
    if parts - set(PARTS):
        raise SystemExit(f"parts: unknown {sorted(parts - set(PARTS))}; choose from {PARTS}, all or none")
    options: dict[str, float | str] = {k: _value(v) for k, v in (kv.split("=") for kv in argv[3:])}
    hand_over(parts)
    folder = pollux_data_dir() / os.environ.get("WL", "workloads")
    jcts, restarts = [], 0
    for w in workloads:
        cfg = SimConfig(nodes=16, gpus_per_node=4, interval_s=60.0, oracle=bool(parts), policy_options=options)
        res = run_simulation(load_workload(folder / f"workload-{w}.csv"), policy, cfg)
        jcts.append(res.avg_jct_s / 3600)
        restarts += res.restarts
    per = " ".join(f"{x:.3f}" for x in jcts)
    label = "+".join(sorted(parts)) or "none (observed)"
    mean = sum(jcts) / len(jcts)
    print(f"{policy} {argv[3:]} truth: {label}  mean {mean:.3f} h  per workload {per}  restarts {restarts}")


if __name__ == "__main__":
    main(sys.argv[1:])
