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
        (out if j.not_before <= now else later).append(j)
    return out, later


def backoff_reason(job: JobView) -> str:
    return f"restart back-off until t={job.not_before:.1f}"
