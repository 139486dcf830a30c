"""Job phases and the one table that says which moves between them are allowed.

FfDL's rule: every status update goes through a monotonic transition table, so a late or
repeated event can never move a job backwards. The ways "back" are moves the controller itself
makes: `Stopping -> Queued` (a preemption or migration it asked for), `Queued -> Pending`
(admission taking quota back) and `Suspended -> Pending` (a user's resume).
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    PENDING = "Pending"  # accepted, not yet admitted (quota, validation of datasets)
    QUEUED = "Queued"  # admitted, waiting for a placement
    STARTING = "Starting"  # launched on a node, process not yet confirmed
    RUNNING = "Running"
    STOPPING = "Stopping"  # asked to checkpoint and exit (preempt, migrate, suspend, cancel)
    SUSPENDED = "Suspended"  # stopped at a user's request, checkpoint kept; holds no quota
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def active(self) -> bool:
        """Holds resources on a node."""
        return self in ACTIVE


TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})
ACTIVE = frozenset({Phase.STARTING, Phase.RUNNING, Phase.STOPPING})

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.QUEUED, Phase.SUSPENDED, Phase.FAILED, Phase.CANCELLED}),
    # Queued -> Pending: admission took its quota back for a job entitled to it (preemption).
    Phase.QUEUED: frozenset({Phase.STARTING, Phase.PENDING, Phase.SUSPENDED, Phase.FAILED, Phase.CANCELLED}),
    # Starting -> Queued: the launch failed before the process ran (or its node vanished).
    Phase.STARTING: frozenset(
        {Phase.RUNNING, Phase.STOPPING, Phase.QUEUED, Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}
    ),
    # Running -> Queued: the process died (crash retried, or node lost) and will resume.
    Phase.RUNNING: frozenset({Phase.STOPPING, Phase.QUEUED, Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}),
    Phase.STOPPING: frozenset({Phase.QUEUED, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}),
    # Suspended -> Pending: resumed by its user; it is admitted again like a new job.
    Phase.SUSPENDED: frozenset({Phase.PENDING, Phase.FAILED, Phase.CANCELLED}),
    Phase.SUCCEEDED: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.CANCELLED: frozenset(),
}


def can_transition(src: Phase, dst: Phase) -> bool:
    return dst in TRANSITIONS[src]


class IllegalTransition(ValueError):
    def __init__(self, src: Phase, dst: Phase) -> None:
        super().__init__(f"illegal phase transition {src} -> {dst}")
        self.src = src
        self.dst = dst
