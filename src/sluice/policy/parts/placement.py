"""Node choice for a job's replicas (gang: all replicas or none)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sluice.model import Allocation, Assignment, JobView, NodeView
from sluice.policy.parts.capacity import Ledger, NodeRoom
from sluice.policy.parts.gpu import requested_gpus

UNSCHEDULABLE = "Unschedulable:"
"""How a wait reason starts when no node of the cluster as it is now could ever hold the job,
healthy or not: it waits for the cluster to grow (Ray's autoscaler, KubeRay), not for others
to finish. Without autoscaling such a job is refused at submit instead."""


def unschedulable(job: JobView, nodes: Iterable[NodeView], per_replica: bool = True) -> str | None:
    """The Unschedulable reason if no node, cordoned or not, could ever hold the job; else None.

    per_replica: one replica must fit on one node (CPU, GPUs, memory), as a replica is one
    process; off for GPU policies that size a job in GPUs across nodes (only totals count).
    An empty cluster is not a verdict: nodes may not have reported yet."""
    sizes = list(nodes)
    if not sizes:
        return None
    big_cpu = max(n.cpu for n in sizes)
    big_gpu = max(n.gpus for n in sizes)
    big_mem = max(n.memory_mb for n in sizes)
    largest = f"the largest node has {big_cpu:g} CPU, {big_gpu} GPU" + (f", {big_mem} MiB" if big_mem else "")
    if per_replica:
        need = []
        if job.cpu_min > big_cpu + 1e-9:
            need.append(f"{job.cpu_min:g} CPU")
        if job.gpus > big_gpu:
            need.append(f"{job.gpus} GPU")
        if job.memory_mb and big_mem and job.memory_mb > big_mem:
            need.append(f"{job.memory_mb} MiB")
        fits_one = any(
            n.cpu + 1e-9 >= job.cpu_min
            and n.gpus >= job.gpus
            and not (job.memory_mb and n.memory_mb and job.memory_mb > n.memory_mb)
            for n in sizes
        )
        if need or not fits_one:
            what = ", ".join(need) if need else "that much CPU, GPU and memory together"
            return f"{UNSCHEDULABLE} one replica needs {what}; {largest} (waiting for the cluster to grow)"
    total_cpu = sum(n.cpu for n in sizes)
    total_gpu = sum(n.gpus for n in sizes)
    if job.replicas_min > 1 and job.replicas_min * job.cpu_min > total_cpu + 1e-9:
        return (
            f"{UNSCHEDULABLE} {job.replicas_min} replicas need {job.replicas_min * job.cpu_min:g} CPU together; "
            f"the cluster has {total_cpu:g} (waiting for the cluster to grow)"
        )
    if requested_gpus(job) > total_gpu:
        return (
            f"{UNSCHEDULABLE} needs {requested_gpus(job)} GPU in all; the cluster has {total_gpu} "
            "(waiting for the cluster to grow)"
        )
    return None


def wait_reason(policy: str, reason: str) -> str:
    """`policy: reason`, except that an Unschedulable reason keeps its leading word."""
    return f"{reason} ({policy})" if reason.startswith(UNSCHEDULABLE) else f"{policy}: {reason}"


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
    never = unschedulable(job, ledger.nodes)
    if never:
        return PlacementResult(None, never)
    nodes = ledger.schedulable()
    if not nodes:
        return PlacementResult(None, "no schedulable node (all cordoned or lost)")
    if all(r.cpu_total < need_cpu or r.gpu_total < need_gpu for r in nodes):
        return PlacementResult(
            None, f"no schedulable node is big enough for one replica ({need_cpu:g} CPU, {need_gpu} GPU)"
        )
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
            # What the nodes have free before this job, not after the replicas tried so far
            # (a gang of 2 with 1 core free said "0.00 CPU unrequested").
            free_cpu = sum(max(0.0, r.cpu_free) for r in nodes)
            what = f"{n} replicas (room for {len(chosen)}; a gang starts all or none)" if n > 1 else "the job"
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
