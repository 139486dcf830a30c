"""Queue orderings: which queued job is considered first."""

from __future__ import annotations

from sluice.model import ClusterView, JobView


def fifo(jobs: list[JobView]) -> list[JobView]:
    """Higher priority first, then earlier submission (Kubernetes' priority queue)."""
    return sorted(jobs, key=lambda j: (-j.priority, j.submitted_at, j.id))


def ready(view: ClusterView, jobs: list[JobView]) -> tuple[list[JobView], list[JobView]]:
    """Split queued jobs into those placeable now and those still in restart back-off."""
    now = view.now
    out: list[JobView] = []
    later: list[JobView] = []
    for j in jobs:
        nb = float(j.hints.get("not_before", 0.0))
        (out if nb <= now else later).append(j)
    return out, later
