"""Free capacity per node, as a small mutable ledger a policy fills while it plans a round."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.model import Allocation, ClusterView


@dataclass
class NodeRoom:
    name: str
    cpu_total: float
    gpu_total: int
    cpu_free: float
    gpu_free: int
    schedulable: bool

    @property
    def cpu_used_fraction(self) -> float:
        return 1.0 - self.cpu_free / self.cpu_total if self.cpu_total > 0 else 1.0


class Ledger:
    """Requested (not used) resources per node; placements in one round debit it."""

    def __init__(self, view: ClusterView) -> None:
        used = view.used()
        self.nodes = list(view.nodes.values())
        """Every node, schedulable or not: what the cluster could ever hold."""
        self.rooms: dict[str, NodeRoom] = {}
        for name, n in view.nodes.items():
            cpu_used, gpu_used = used.get(name, (0.0, 0))
            self.rooms[name] = NodeRoom(name, n.cpu, n.gpus, n.cpu - cpu_used, n.gpus - gpu_used, n.schedulable)

    def debit(self, alloc: Allocation) -> None:
        for a in alloc.assignments:
            r = self.rooms[a.node]
            r.cpu_free -= a.cpu_request
            r.gpu_free -= a.gpus

    def credit(self, alloc: Allocation) -> None:
        for a in alloc.assignments:
            if a.node in self.rooms:
                r = self.rooms[a.node]
                r.cpu_free += a.cpu_request
                r.gpu_free += a.gpus

    def schedulable(self) -> list[NodeRoom]:
        return [r for r in self.rooms.values() if r.schedulable]
