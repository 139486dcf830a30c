"""What an elastic policy hands out, as one small interface: GPUs or CPU replicas.

Why: Pollux, Optimus and `sluice` size GPU jobs in GPUs; the same rules size CPU
data-parallel jobs in replicas (`resources.replicas: {min, max}`), where a replica is one
process needing `cpu_min` cores on some node. Turning per-job counts into feasible decisions
(`elastic.apply_targets`) and Tiresias' gang walk only need to know how many units a job
holds, and where n units of it would go now; everything else is the same, so it is written
once against this interface instead of once per resource.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from sluice.model import Allocation, ClusterView, JobView
from sluice.policy.parts.capacity import Ledger
from sluice.policy.parts.gpu import GpuLedger, describe, gpu_allocation, held_gpus, requested_gpus
from sluice.policy.parts.placement import place_gang, spread


class Units(Protocol):
    unit: str
    """How reasons name one unit: "GPUs" or "replicas"."""
    per_replica: bool
    """Whether one replica must fit on one node (`placement.unschedulable`)."""

    def held(self, job: JobView) -> int: ...
    def asked(self, job: JobView) -> int: ...
    def total(self) -> float:
        """Capacity of the schedulable nodes, in what `need` counts (GPUs, or cores)."""
        ...

    def need(self, job: JobView, n: int) -> float:
        """What n units of the job take out of `total`."""
        ...

    def credit(self, alloc: Allocation) -> None: ...
    def debit(self, alloc: Allocation) -> None: ...
    def take(self, job: JobView, n: int, keep: Allocation | None = None) -> Allocation | None:
        """Where n units of the job go now (debited), near `keep` where it can; None: no room."""
        ...

    def where(self, alloc: Allocation) -> str: ...


class GpuUnits:
    """GPUs, consolidated on as few nodes as possible (`gpu.GpuLedger`)."""

    unit = "GPUs"
    per_replica = False

    def __init__(self, view: ClusterView, ledger: GpuLedger | None = None) -> None:
        self.ledger = ledger or GpuLedger(view)
        self._total = sum(n.gpus for n in view.nodes.values() if n.schedulable)

    def held(self, job: JobView) -> int:
        return held_gpus(job)

    def asked(self, job: JobView) -> int:
        return requested_gpus(job)

    def total(self) -> float:
        return float(self._total)

    def need(self, job: JobView, n: int) -> float:
        return float(n)

    def credit(self, alloc: Allocation) -> None:
        self.ledger.credit(alloc)

    def debit(self, alloc: Allocation) -> None:
        self.ledger.debit(alloc.gpus_per_node())

    def take(self, job: JobView, n: int, keep: Allocation | None = None) -> Allocation | None:
        prefer: list[str] = []
        if keep is not None:
            per = keep.gpus_per_node()
            prefer = sorted(per, key=lambda node: -per[node])
        pieces = self.ledger.take(n, prefer=prefer)
        return None if pieces is None else gpu_allocation(job, pieces)

    def where(self, alloc: Allocation) -> str:
        return describe(alloc.gpus_per_node())


class ReplicaUnits:
    """CPU replicas of `cpu_min` cores each, spread over the least-requested nodes (as the
    `kube`-style default does), counted against requested cores (`capacity.Ledger`)."""

    unit = "replicas"
    per_replica = True

    def __init__(self, view: ClusterView, ledger: Ledger | None = None) -> None:
        self.ledger = ledger or Ledger(view)
        self._total = sum(n.cpu for n in view.nodes.values() if n.schedulable)

    def held(self, job: JobView) -> int:
        return job.allocation.replicas if job.allocation is not None else 0

    def asked(self, job: JobView) -> int:
        return job.replicas_min

    def total(self) -> float:
        return self._total

    def need(self, job: JobView, n: int) -> float:
        return n * job.cpu_min

    def credit(self, alloc: Allocation) -> None:
        self.ledger.credit(alloc)

    def debit(self, alloc: Allocation) -> None:
        self.ledger.debit(alloc)

    def take(self, job: JobView, n: int, keep: Allocation | None = None) -> Allocation | None:
        return place_gang(replace(job, replicas_min=n), self.ledger, spread).allocation

    def where(self, alloc: Allocation) -> str:
        per: dict[str, int] = {}
        for a in alloc.assignments:
            per[a.node] = per.get(a.node, 0) + 1
        return describe(per)


class Pool:
    """Room for a round's plan from scratch: the capacity of the schedulable nodes less what
    jobs outside the plan hold. GPUs are alike (a count); a CPU replica needs `cpu_min`
    cores on one node, so replicas are counted per node, each on the node with most room
    (the spread the placement will use)."""

    def __init__(self, units: Units, view: ClusterView, planned: list[JobView]) -> None:
        mine = {j.id for j in planned}
        self.per_replica = units.per_replica
        self.gpus = units.total()
        """GPUs: the whole healthy capacity, as the GPU policies have always planned (a
        stopping job's GPUs are free by the time the plan's placements run)."""
        self.room: dict[str, float] = {}
        if not units.per_replica:
            return
        for name, node in view.nodes.items():
            if node.schedulable:
                self.room[name] = node.cpu
        for j in view.jobs.values():
            if j.id in mine or j.allocation is None or not j.phase.active:
                continue
            for a in j.allocation.assignments:
                if a.node in self.room:
                    self.room[a.node] -= a.cpu_request

    def take(self, job: JobView, n: int = 1) -> bool:
        """Reserve n more units of the job, all or none."""
        if not self.per_replica:
            if n > self.gpus:
                return False
            self.gpus -= n
            return True
        trial = dict(self.room)
        for _ in range(n):
            node = max(trial, key=lambda k: trial[k], default=None)
            if node is None or trial[node] + 1e-9 < job.cpu_min:
                return False
            trial[node] -= job.cpu_min
        self.room = trial
        return True
