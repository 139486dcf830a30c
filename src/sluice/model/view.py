"""ClusterView: the immutable snapshot a policy decides on. Plain values only."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from sluice.model.allocation import Allocation
from sluice.model.capabilities import EngineCapabilities
from sluice.model.oracle import OracleInfo
from sluice.model.phase import Phase
from sluice.model.progress import ProgressSignals

_READER_COPY = re.compile(r"uid-[0-9]+:(?P<name>.+)-[0-9a-f]{10}")


def dataset_of(key: str) -> str:
    """The dataset (`owner/name`) a cache key of a job or a node report stands for.

    Keys are `owner/name` for the shared cache; under tenant isolation a job reads only its
    uid's own copy, and nodes report that copy as `uid-<uid>:<cache folder>` (the folder being
    `owner~name-<hash>`; `sluice.data.cache.reader_key` makes them, and a unit test keeps the
    two in step)."""
    m = _READER_COPY.fullmatch(key)
    return m.group("name").replace("~", "/") if m else key


class NodeHealth(StrEnum):
    HEALTHY = "Healthy"
    SUSPECT = "Suspect"
    CORDONED = "Cordoned"
    LOST = "Lost"


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    cpu: float
    gpus: int = 0
    memory_mb: int = 0
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    health: NodeHealth = NodeHealth.HEALTHY
    health_reason: str = ""
    cached_datasets: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    cache_free_bytes: int = 0

    @property
    def schedulable(self) -> bool:
        return self.health in (NodeHealth.HEALTHY, NodeHealth.SUSPECT)


@dataclass(frozen=True, slots=True)
class JobView:
    """A non-terminal job as policies see it.

    cpu_min/cpu_max: the spec's per-replica CPU range (cpu_max None = up to the node).
    attained_service: resource-seconds already received (GPU-s if it uses GPUs, else CPU-s),
                      for least-attained-service policies.
    not_before:       restart back-off: the job may not be placed before this time (0 = now).
    progress:         what the job has reported (steps, loss, declared total steps) and what
                      the controller derived from it (throughput, predicted remaining time).
    oracle:           the simulator's ground truth, only in an explicit `--oracle` study
                      (upper bounds); None otherwise, and always None on a real engine.
    """

    id: str
    tenant: str
    name: str
    phase: Phase
    submitted_at: float
    priority: int = 0
    queue: str = "default"
    cpu_min: float = 1.0
    cpu_max: float | None = None
    memory_mb: int | None = None
    gpus: int = 0
    replicas_min: int = 1
    replicas_max: int = 1
    allocation: Allocation | None = None
    started_at: float | None = None
    attempt: int = 0
    """Launches so far (a new attempt is a new set of processes)."""
    restarts: int = 0
    attained_service: float = 0.0
    progress: ProgressSignals = ProgressSignals()
    qoe_loss: float | None = None
    qoe_deadline: float | None = None
    datasets: tuple[str, ...] = ()
    """Keys of the datasets it mounts, as nodes report them: `owner/name`, or under isolation
    its uid's own copy (`dataset_of` gives the dataset)."""
    dataset_bytes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    not_before: float = 0.0
    oracle: OracleInfo | None = None


@dataclass(frozen=True, slots=True)
class ClusterView:
    now: float
    nodes: Mapping[str, NodeView]
    jobs: Mapping[str, JobView]
    capabilities: EngineCapabilities = EngineCapabilities()
    """What the engine can carry out: a policy need not propose what it cannot (the
    controller refuses such a decision anyway, with the reason)."""

    def jobs_in(self, *phases: Phase) -> list[JobView]:
        return [j for j in self.jobs.values() if j.phase in phases]

    @property
    def queued(self) -> list[JobView]:
        return self.jobs_in(Phase.QUEUED)

    @property
    def running(self) -> list[JobView]:
        return self.jobs_in(Phase.STARTING, Phase.RUNNING)

    def used(self) -> dict[str, tuple[float, int]]:
        """CPU request and GPUs held on each node by active jobs."""
        out: dict[str, tuple[float, int]] = {n: (0.0, 0) for n in self.nodes}
        for j in self.jobs.values():
            if j.allocation is None or not j.phase.active:
                continue
            for a in j.allocation.assignments:
                cpu, gpu = out.get(a.node, (0.0, 0))
                out[a.node] = (cpu + a.cpu_request, gpu + a.gpus)
        return out

    def jobs_on(self, node: str) -> list[JobView]:
        return [
            j for j in self.jobs.values() if j.allocation is not None and j.phase.active and node in j.allocation.nodes
        ]
