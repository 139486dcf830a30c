"""One elastic round, whatever the unit: every job its smallest size in order while room
lasts, then each spare unit to the job it gains most, then the fewest feasible decisions.

Why shared: Pollux (generalised mean of speedups) and Optimus (remaining time) differ only in
what a unit is worth (`gain`), and GPU jobs and CPU data-parallel jobs only in what a unit is
(`units.Units`) and where a job's speed-up comes from (`Curves`: `elastic.Speedups` over
GPUs, `replicas.ReplicaCurves` over replicas). So each policy states its rule once and it
sizes both kinds of job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sluice.model import ClusterView, Decision, JobView, Phase
from sluice.policy.parts.elastic import Speedups, apply_targets
from sluice.policy.parts.gpu import GpuLedger, uses_gpus
from sluice.policy.parts.greedy import hand_out
from sluice.policy.parts.ordering import ready
from sluice.policy.parts.replicas import ReplicaCurves, cpu_jobs
from sluice.policy.parts.units import GpuUnits, Pool, ReplicaUnits, Units


class Curves(Protocol):
    """A job's speed-up at n units and the sizes a policy may give it."""

    def __call__(self, job: JobView, n: int) -> float: ...
    def least(self, job: JobView) -> int:
        """The size every job gets first (GPUs: 1; replicas: the spec's min, or the size a
        job is still being measured at)."""
        ...

    def most(self, job: JobView) -> int: ...
    def remaining_ref_s(self, job: JobView) -> float: ...


def size_by_gain(
    view: ClusterView,
    jobs: list[JobView],
    units: Units,
    curves: Curves,
    gain: Callable[[JobView, int], float],
    policy: str,
    why: Callable[[JobView, int], str],
) -> list[Decision]:
    """`jobs` in the order they get their smallest size; `gain(job, k)` what the (k+1)-th unit
    is worth to a job holding k (only asked below `curves.most`)."""
    pool = Pool(units, view, jobs)
    n: dict[str, int] = {}
    for j in jobs:
        least = curves.least(j)
        n[j.id] = least if pool.take(j, least) else 0

    def next_gain(j: JobView) -> float:
        k = n[j.id]
        if k == 0 or k + 1 > curves.most(j):
            return 0.0
        return gain(j, k)

    hand_out(jobs, n, 1 << 30, next_gain, take=lambda j: pool.take(j))
    return apply_targets(view, jobs, n, policy, why, units)


SizeRule = Callable[[ClusterView, list[JobView], Units, Curves], list[Decision]]
"""A policy's rule for one kind of job: (view, jobs oldest first, units, curves) -> decisions."""


def gpu_then_cpu(view: ClusterView, learn: bool, size: SizeRule) -> list[Decision]:
    """GPU jobs sized in GPUs, then CPU-only jobs in replicas, by the same rule `size`; with
    `learn` off both use the n^0.8 prior instead of curves learned from measured rates."""
    queued, _ = ready(view, view.queued)
    jobs = [j for j in view.jobs.values() if j.phase in (Phase.STARTING, Phase.RUNNING)] + queued
    jobs = sorted((j for j in jobs if uses_gpus(j)), key=lambda j: (j.submitted_at, j.id))
    ledger = GpuLedger(view)
    out = size(view, jobs, GpuUnits(view, ledger), Speedups(ledger.per_node, learn=learn))
    cpu = cpu_jobs(view)
    if cpu:
        out += size(view, cpu, ReplicaUnits(view), ReplicaCurves(learn=learn))
    return out
