"""Decisions: what a policy wants done, each with the reason a human will read.

Policies never act. They return these; the controller's executor carries them out and
records each one (with its reason) in the job's event log, which is what `sluice job why`
prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.model.allocation import Allocation
from sluice.model.view import NodeHealth


@dataclass(frozen=True, slots=True)
class Place:
    """Start (or resume from its checkpoint) a queued job with this allocation."""

    job_id: str
    allocation: Allocation
    reason: str


@dataclass(frozen=True, slots=True)
class Resize:
    """Change a running job's resources: in place where the engine can (live CPU limit); a
    change of replica count on an engine that runs replicas as processes is carried out as
    a checkpointed restart at the new world size (elastic resize, docs/architecture.md),
    within the spec's `resources.replicas` range."""

    job_id: str
    allocation: Allocation
    reason: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """Checkpoint and stop a running job; it goes back to the queue."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Migrate:
    """Checkpoint a running job and resume it elsewhere (SpeCon)."""

    job_id: str
    allocation: Allocation
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """A job stays queued; the reason is what `sluice job why` shows as its pending reason."""

    job_id: str
    reason: str


Decision = Place | Resize | Preempt | Migrate | Wait


@dataclass(frozen=True, slots=True)
class SetNodeHealth:
    """Change a node's health, with the reason `sluice node list` and the event log show.

    Observers of the round (the health monitor) return these instead of acting: the
    controller executes them like any decision. A Cordoned node gets nothing new and its
    jobs move off through their checkpoints; Healthy re-admits it.
    """

    node: str
    health: NodeHealth
    reason: str
    by: str = "detector"
    """Who decided: "detector" or "operator" (an operator's cordon is kept over restarts)."""


NodeDecision = SetNodeHealth
