"""Placing jobs at the size they asked for (no elasticity): the core of fifo and binpack."""

from __future__ import annotations

from sluice.model import ClusterView, Decision, JobView, Place, Wait
from sluice.policy.parts.capacity import Ledger
from sluice.policy.parts.gpu import GpuLedger, describe, gpu_allocation, requested_gpus, uses_gpus
from sluice.policy.parts.placement import NodeScore, place_gang, unschedulable, wait_reason


def place_rigid(
    view: ClusterView,
    order: list[JobView],
    policy: str,
    score: NodeScore,
    *,
    blocking: bool,
    gpus: GpuLedger | None = None,
    cpus: Ledger | None = None,
) -> list[Decision]:
    """Place each job of `order` at its requested size. GPU jobs go on as few nodes as
    possible; CPU jobs by `score`. With `blocking`, the first job that does not fit holds
    back every job behind it (strict FIFO, no backfill)."""
    gpus = gpus or GpuLedger(view)
    cpus = cpus or Ledger(view)
    out: list[Decision] = []
    blocker: JobView | None = None
    for job in order:
        if blocker is not None:
            out.append(Wait(job.id, f"{policy}: behind {blocker.name} ({blocker.id}), first in line"))
            continue
        if uses_gpus(job):
            never = unschedulable(job, view.nodes.values(), per_replica=False)
            if never:
                out.append(Wait(job.id, wait_reason(policy, never)))
                if blocking:
                    blocker = job
                continue
            n = requested_gpus(job)
            pieces = gpus.take(n)
            if pieces is None:
                out.append(Wait(job.id, f"{policy}: needs {n} GPUs, {gpus.total_free} free"))
                if blocking:
                    blocker = job
                continue
            out.append(Place(job.id, gpu_allocation(job, pieces), f"{policy}: {n} GPUs on {describe(pieces)}"))
            continue
        res = place_gang(job, cpus, score)
        if res.allocation is None:
            out.append(Wait(job.id, wait_reason(policy, res.reason)))
            if blocking:
                blocker = job
            continue
        out.append(Place(job.id, res.allocation, f"{policy}: fits on {', '.join(res.allocation.nodes)}"))
    return out
