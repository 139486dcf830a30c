"""Queue orderings: which queued job is considered first."""

from __future__ import annotations

import time

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
    """The wait's reason, with an instant that stays the same round after round (so the reason
    does not change, and make an event, every round). A wall-clock time is written in ISO-8601
    UTC (`2026-11-23T12:01:05Z`), which the CLI shows in local time; a virtual clock (the
    simulator's seconds since its start) as `t=<seconds>`."""
    t = job.not_before
    if t < 10**8:
        return f"restart back-off until t={t:.1f}"
    return f"restart back-off until {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(t))}"
