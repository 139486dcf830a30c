"""Job phases and the one table that says which moves between them are allowed.

FfDL's rule: every status update goes through a monotonic transition table, so a late or
repeated event can never move a job backwards. `Stopping -> Queued` is the only way "back",
and it happens only for a preemption or migration the controller itself asked for.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    PENDING = "Pending"  # accepted, not yet admitted (quota, validation of datasets)
    QUEUED = "Queued"  # admitted, waiting for a placement
    STARTING = "Starting"  # launched on a node, process not yet confirmed
    RUNNING = "Running"
    STOPPING = "Stopping"  # asked to checkpoint and exit (preempt, migrate, cancel)
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
    Phase.PENDING: frozenset({Phase.QUEUED, Phase.FAILED, Phase.CANCELLED}),
    Phase.QUEUED: frozenset({Phase.STARTING, Phase.FAILED, Phase.CANCELLED}),
    # Starting -> Queued: the launch failed before the process ran (or its node vanished).
    Phase.STARTING: frozenset(
        {Phase.RUNNING, Phase.STOPPING, Phase.QUEUED, Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}
    ),
    # Running -> Queued: the process died (crash retried, or node lost) and will resume.
    Phase.RUNNING: frozenset({Phase.STOPPING, Phase.QUEUED, Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}),
    Phase.STOPPING: frozenset({Phase.QUEUED, Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}),
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
