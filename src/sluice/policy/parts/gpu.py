"""GPU accounting and placement for GPU policies: free GPUs per node, consolidated
placement (fewest nodes, best fit), and what a job asks for.

Buckets of nodes by free-GPU count make a placement O(GPUs per node) rather than a scan of
every node, which is what keeps a round on 5,000 nodes well under a second.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.model import Allocation, Assignment, ClusterView, JobView, NodeHealth


def requested_gpus(job: JobView) -> int:
    """GPUs the user asked for in the spec: replicas_min × GPUs per replica."""
    return job.gpus * job.replicas_min


def max_gpus(job: JobView) -> int:
    """Most GPUs the spec lets the job use: replicas_max × GPUs per replica."""
    return job.gpus * max(job.replicas_max, job.replicas_min)


def held_gpus(job: JobView) -> int:
    return job.allocation.total_gpus if job.allocation is not None else 0


def uses_gpus(job: JobView) -> bool:
    return job.gpus > 0 or requested_gpus(job) > 0


class GpuLedger:
    """Free GPUs on schedulable nodes; placements in one round debit it."""

    def __init__(self, view: ClusterView, release: Iterable[JobView] = ()) -> None:
        ok = (NodeHealth.HEALTHY, NodeHealth.SUSPECT)
        self.capacity: dict[str, int] = {k: n.gpus for k, n in view.nodes.items() if n.gpus > 0 and n.health in ok}
        self.per_node = max(self.capacity.values(), default=0)
        free = dict(self.capacity)
        for j in view.jobs.values():
            if j.allocation is None or not j.phase.active:
                continue
            for a in j.allocation.assignments:
                if a.gpus and a.node in free:
                    free[a.node] -= a.gpus
        for j in release:
            if j.allocation is not None:
                for a in j.allocation.assignments:
                    if a.node in free:
                        free[a.node] += a.gpus
        self.free = free
        self._buckets: list[dict[str, None]] = [{} for _ in range(self.per_node + 1)]
        top = self.per_node
        for node, f in free.items():
            self._buckets[0 if f < 0 else (top if f > top else f)][node] = None

    @property
    def total_free(self) -> int:
        return sum(max(0, f) for f in self.free.values())

    def _set(self, node: str, value: int) -> None:
        old = max(0, min(self.free[node], self.per_node))
        self._buckets[old].pop(node, None)
        self.free[node] = value
        self._buckets[max(0, min(value, self.per_node))][node] = None

    def credit(self, alloc: Allocation | None) -> None:
        if alloc is None:
            return
        for node, g in alloc.gpus_per_node().items():
            if node in self.free:
                self._set(node, self.free[node] + g)

    def debit(self, pieces: dict[str, int]) -> None:
        for node, g in pieces.items():
            self._set(node, self.free[node] - g)

    def fits(self, pieces: dict[str, int]) -> bool:
        return all(self.free.get(n, 0) >= g for n, g in pieces.items())

    def find(self, n: int, prefer: Iterable[str] = ()) -> dict[str, int] | None:
        """Where `n` GPUs would go: on one node if it fits (best fit: the fullest node that
        still has room), else on as few nodes as possible (emptiest first). `prefer` names
        nodes to try first (the job's current ones, so a resize moves little). Not debited."""
        if n <= 0:
            return {}
        if n > self.total_free:
            return None
        pieces: dict[str, int] = {}
        need = n
        for node in prefer:
            f = self.free.get(node, 0)
            if f > 0 and need > 0:
                take = min(f, need)
                pieces[node] = take
                need -= take
        if need == 0:
            return pieces
        if need <= self.per_node and not pieces:
            for k in range(need, self.per_node + 1):
                for node in self._buckets[k]:
                    return {node: need}
        for k in range(self.per_node, 0, -1):
            for node in self._buckets[k]:
                if node in pieces:
                    continue
                take = min(k, need)
                pieces[node] = take
                need -= take
                if need == 0:
                    return pieces
        return None

    def take(self, n: int, prefer: Iterable[str] = ()) -> dict[str, int] | None:
        pieces = self.find(n, prefer)
        if pieces:
            self.debit(pieces)
        return pieces


def gpu_allocation(job: JobView, pieces: dict[str, int]) -> Allocation:
    """One Assignment per node slice: that node's GPUs and one CPU request per GPU."""
    per_gpu_cpu = job.cpu_min if job.gpus <= 1 else job.cpu_min / job.gpus
    return Allocation(
        tuple(Assignment(node, cpu_request=per_gpu_cpu * g, gpus=g) for node, g in sorted(pieces.items()) if g > 0)
    )


def describe(pieces: dict[str, int]) -> str:
    if len(pieces) <= 3:
        return "+".join(f"{n}:{g}" for n, g in sorted(pieces.items()))
    return f"{sum(pieces.values())} GPUs on {len(pieces)} nodes"
