"""JobRecord: the durable state of one job, as the store keeps it and the controller edits it."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.model.allocation import Allocation
from sluice.model.phase import IllegalTransition, Phase, can_transition
from sluice.spec import JobSpec


@dataclass
class JobRecord:
    """One job. `attempt` counts launches: a process of an older attempt is never adopted,
    which is how "never running twice" is enforced after a crash."""

    id: str
    tenant: str
    spec: JobSpec
    phase: Phase = Phase.PENDING
    reason: str = ""
    submitted_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    attempt: int = 0
    restarts: int = 0
    allocation: Allocation | None = None
    exit_code: int | None = None
    checkpoint: str | None = None
    step: int = 0
    loss: float | None = None
    not_before: float = 0.0
    """Earliest time a requeued job may be placed again (restart back-off)."""
    attained_service: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    def move(self, dst: Phase, reason: str) -> None:
        """Change phase through the transition table; raises on an illegal move."""
        if dst == self.phase:
            self.reason = reason or self.reason
            return
        if not can_transition(self.phase, dst):
            raise IllegalTransition(self.phase, dst)
        self.phase = dst
        self.reason = reason
