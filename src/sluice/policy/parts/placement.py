"""Node choice for a job's replicas (gang: all replicas or none)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.model import Allocation, Assignment, JobView
from sluice.policy.parts.capacity import Ledger, NodeRoom

NodeScore = Callable[[NodeRoom, JobView], float]
"""Higher is better."""


def spread(room: NodeRoom, job: JobView) -> float:
    """Kubernetes' default leaning: the least-requested node."""
    return -room.cpu_used_fraction


def binpack(room: NodeRoom, job: JobView) -> float:
    """Fill the fullest node that still fits, keeping whole nodes free for big jobs."""
    return room.cpu_used_fraction


@dataclass(frozen=True)
class PlacementResult:
    allocation: Allocation | None
    reason: str


def place_gang(
    job: JobView,
    ledger: Ledger,
    score: NodeScore,
    cpu_limit: float | None = None,
    distinct_nodes: bool = False,
) -> PlacementResult:
    """Place `job.replicas_min` replicas each needing `cpu_min` cores and `gpus` GPUs.

    Returns an allocation and debits the ledger, or returns the reason it does not fit
    (the pending reason a user sees, in the style of Slurm's `squeue` reasons).
    """
    need_cpu, need_gpu, n = job.cpu_min, job.gpus, job.replicas_min
    nodes = ledger.schedulable()
    if not nodes:
        return PlacementResult(None, "no schedulable node (all cordoned or lost)")
    if all(r.cpu_total < need_cpu or r.gpu_total < need_gpu for r in nodes):
        return PlacementResult(None, f"no node is big enough for one replica ({need_cpu:g} CPU, {need_gpu} GPU)")
    chosen: list[Assignment] = []
    trial = {r.name: (r.cpu_free, r.gpu_free) for r in nodes}
    for _ in range(n):
        best: NodeRoom | None = None
        best_score = float("-inf")
        for r in nodes:
            cpu_free, gpu_free = trial[r.name]
            if cpu_free + 1e-9 < need_cpu or gpu_free < need_gpu:
                continue
            if distinct_nodes and any(a.node == r.name for a in chosen):
                continue
            probe = NodeRoom(r.name, r.cpu_total, r.gpu_total, cpu_free, gpu_free, True)
            s = score(probe, job)
            if s > best_score:
                best, best_score = r, s
        if best is None:
            free_cpu = sum(max(0.0, c) for c, _ in trial.values())
            what = f"{n} replicas" if n > 1 else "the job"
            return PlacementResult(
                None,
                f"insufficient resources for {what}: needs {need_cpu:g} CPU"
                + (f" and {need_gpu} GPU" if need_gpu else "")
                + f" per replica; {free_cpu:.2f} CPU unrequested across schedulable nodes",
            )
        cpu_free, gpu_free = trial[best.name]
        trial[best.name] = (cpu_free - need_cpu, gpu_free - need_gpu)
        chosen.append(Assignment(best.name, need_cpu, cpu_limit, need_gpu))
    alloc = Allocation(tuple(chosen))
    ledger.debit(alloc)
    return PlacementResult(alloc, "")
