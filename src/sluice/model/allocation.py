"""What a job holds: one Assignment per replica (or per node slice), each on one node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Assignment:
    """Resources on one node.

    cpu_request: cores the job is entitled to under contention (kernel CPU shares/weight).
    cpu_limit:   hard ceiling in cores (CFS quota); None means no ceiling.
    gpus:        number of GPUs on that node.
    """

    node: str
    cpu_request: float = 1.0
    cpu_limit: float | None = None
    gpus: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "cpu_request": self.cpu_request, "cpu_limit": self.cpu_limit, "gpus": self.gpus}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Assignment:
        return Assignment(
            node=str(d["node"]),
            cpu_request=float(d.get("cpu_request", 1.0)),
            cpu_limit=None if d.get("cpu_limit") is None else float(d["cpu_limit"]),
            gpus=int(d.get("gpus", 0)),
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    assignments: tuple[Assignment, ...]

    @staticmethod
    def single(node: str, cpu_request: float = 1.0, cpu_limit: float | None = None, gpus: int = 0) -> Allocation:
        return Allocation((Assignment(node, cpu_request, cpu_limit, gpus),))

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.node for a in self.assignments))

    @property
    def primary_node(self) -> str:
        return self.assignments[0].node

    @property
    def total_gpus(self) -> int:
        return sum(a.gpus for a in self.assignments)

    @property
    def total_cpu_request(self) -> float:
        return sum(a.cpu_request for a in self.assignments)

    @property
    def replicas(self) -> int:
        return len(self.assignments)

    def gpus_per_node(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.assignments:
            out[a.node] = out.get(a.node, 0) + a.gpus
        return out

    def with_cpu_limit(self, limit: float | None) -> Allocation:
        return Allocation(tuple(Assignment(a.node, a.cpu_request, limit, a.gpus) for a in self.assignments))

    def to_list(self) -> list[dict[str, Any]]:
        return [a.to_dict() for a in self.assignments]

    @staticmethod
    def from_list(items: list[dict[str, Any]]) -> Allocation:
        return Allocation(tuple(Assignment.from_dict(d) for d in items))

    def describe(self) -> str:
        parts = []
        for a in self.assignments:
            lim = "unlimited" if a.cpu_limit is None else f"{a.cpu_limit:.2f}"
            gpu = f", {a.gpus} GPU" if a.gpus else ""
            parts.append(f"{a.node}(cpu req {a.cpu_request:.2f}, limit {lim}{gpu})")
        return " + ".join(parts)
