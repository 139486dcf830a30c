"""Cooperative job and data placement (Kang; Fluid's cache affinity), as pure scoring.

A node's score for a job = compute fit + the share of the job's data already cached there +
whether the node's cache has room for the rest. The queue is sorted by the smallest storage
gap (bytes still to fetch on the best node), and jobs that share a dataset are steered to the
node where an earlier job of the round is about to warm it — so the cache is filled once and
then reused. Data is never migrated; only jobs are placed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sluice.model import ClusterView, JobView, NodeView
from sluice.policy.parts.capacity import NodeRoom


@dataclass(frozen=True)
class DataWeights:
    """Weights of the three terms (Fluid weighs same node 100 over same zone 50 — locality first)."""

    compute: float = 1.0
    local: float = 2.0
    room: float = 0.5


def job_bytes(job: JobView) -> dict[str, int]:
    """Bytes per dataset of the job; 1 each when sizes are unknown (then shares are counted)."""
    return {d: max(1, int(job.dataset_bytes.get(d, 1))) for d in job.datasets}


def local_share(node: NodeView, job: JobView, planned: Mapping[str, set[str]] | None = None) -> float:
    """Share of the job's bytes already cached on `node` (or about to be, by a job placed earlier
    in this round)."""
    sizes = job_bytes(job)
    total = sum(sizes.values())
    if total == 0:
        return 0.0
    soon = planned.get(node.name, set()) if planned else set()
    held = sum(b * (1.0 if d in soon else float(node.cached_datasets.get(d, 0.0))) for d, b in sizes.items())
    return held / total


def missing_bytes(node: NodeView, job: JobView, planned: Mapping[str, set[str]] | None = None) -> float:
    sizes = job_bytes(job)
    return sum(sizes.values()) * (1.0 - local_share(node, job, planned))


def storage_gap(view: ClusterView, job: JobView) -> float:
    """Bytes the job would still fetch on its best schedulable node."""
    gaps = [missing_bytes(n, job) for n in view.nodes.values() if n.schedulable]
    return min(gaps) if gaps else float("inf")


def order_by_storage_gap(view: ClusterView, jobs: list[JobView]) -> list[JobView]:
    """Priority first; then smallest storage gap; jobs sharing a dataset next to each other (so the
    first warms the cache and the rest reuse it); then submission time."""
    first_seen: dict[str, float] = {}
    for j in sorted(jobs, key=lambda j: (j.submitted_at, j.id)):
        for d in j.datasets:
            first_seen.setdefault(d, j.submitted_at)

    def key(j: JobView) -> tuple[float, float, float, float, str]:
        group = min((first_seen[d] for d in j.datasets), default=j.submitted_at)
        return (-j.priority, storage_gap(view, j), group, j.submitted_at, j.id)

    return sorted(jobs, key=key)


@dataclass
class DataScorer:
    """A NodeScore for place_gang that knows the nodes' caches and this round's placements."""

    view: ClusterView
    weights: DataWeights = DataWeights()
    planned: dict[str, set[str]] = field(default_factory=dict)

    def __call__(self, room: NodeRoom, job: JobView) -> float:
        return self.parts(room, job)[0]

    def parts(self, room: NodeRoom, job: JobView) -> tuple[float, float, float, float]:
        """(score, compute fit, local share, room for the rest)."""
        node = self.view.nodes[room.name]
        fit = 1.0 - max(0.0, room.cpu_free - job.cpu_min) / room.cpu_total if room.cpu_total > 0 else 0.0
        if not job.datasets:
            return fit, fit, 0.0, 1.0
        share = local_share(node, job, self.planned)
        missing = missing_bytes(node, job, self.planned)
        has_room = 1.0 if missing <= 0 else min(1.0, node.cache_free_bytes / missing)
        w = self.weights
        return w.compute * fit + w.local * share + w.room * has_room, fit, share, has_room

    def placed(self, job: JobView, node: str) -> None:
        """Remember that `node` will hold the job's datasets (it warms them)."""
        self.planned.setdefault(node, set()).update(job.datasets)
