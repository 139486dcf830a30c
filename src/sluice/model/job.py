"""JobRecord: the durable state of one job, exactly as the job book keeps it.

Records are immutable. The job book (`control/book.py`) is the only code that makes a new
one, through its transition method, and it writes each new record to the store together
with the event that explains it. Everyone else (controller, API, metrics, benchmarks)
reads snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sluice.model.allocation import Allocation
from sluice.model.phase import Phase
from sluice.spec import JobSpec


class StopKind(StrEnum):
    """Why the controller asked a running job to stop; decides how its exit is read."""

    PREEMPT = "preempt"  # back to the queue, resume from the checkpoint
    MIGRATE = "migrate"  # resume at once on `target`
    RESIZE = "resize"  # resume at once on `target`, a different number of replicas (elastic)
    SUSPEND = "suspend"  # end as Suspended, checkpoint kept, until its user resumes it
    CANCEL = "cancel"  # end as Cancelled, never run again
    TIME_LIMIT = "time_limit"  # end as Failed: it ran past spec.max_runtime_s (its checkpoint kept)


@dataclass(frozen=True, slots=True)
class StopIntent:
    """Persisted with the job, so an exit that arrives after a control-plane crash is still
    read as the preemption, migration, resize or cancel it was, not as a crash."""

    kind: StopKind
    reason: str
    target: Allocation | None = None
    asked_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "reason": self.reason,
            "target": self.target.to_list() if self.target else None,
            "asked_at": self.asked_at,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> StopIntent:
        t = d.get("target")
        return StopIntent(
            StopKind(str(d["kind"])),
            str(d.get("reason", "")),
            Allocation.from_list(t) if t else None,
            float(d.get("asked_at", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job. `attempt` counts launches: a process of an older attempt is never adopted,
    which is how "never running twice" is enforced after a crash. `restarts` counts the
    failed attempts that were retried; it never exceeds `spec.max_restarts`."""

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
    """Path of the newest checkpoint the job reported."""
    checkpoint_step: int | None = None
    """Step that checkpoint holds (shown when the job resumes from it)."""
    step: int = 0
    loss: float | None = None
    not_before: float = 0.0
    """Earliest time a requeued job may be placed again (restart back-off)."""
    attained_service: float = 0.0
    """Resource-seconds received so far (GPU-s for GPU jobs, else CPU-s)."""
    stop_intent: StopIntent | None = None
    """Set while the job is Stopping: why the controller asked it to stop."""
    requeues: int = 0
    """Times the job went back to the queue (preemption, migration, retry, lost node)."""
    last_stop_s: float | None = None
    """How long the last requested stop took, from the ask to the exit (seconds)."""
    qoe_met_at: float | None = None
    """When the job first reached its QoE loss target, if it has."""
    run_s: float = 0.0
    """Seconds it has run (Starting or Running), summed over its attempts: what
    `spec.max_runtime_s` is held against."""
    run_until: float | None = None
    """The time `run_s` (and `attained_service`) is counted up to: set when an attempt starts,
    moved on each round. A plane that restarts and finds the attempt still running charges
    it from here, so the time the plane was down counts against its limits too."""
    cpu_used_s: float = 0.0
    """CPU-seconds its processes used, summed over its attempts, as the nodes measure them
    (cgroup counters): what it used, beside what it held (`attained_service`)."""
    attempt_cpu_s: float = 0.0
    """The current attempt's CPU-seconds as last counted into `cpu_used_s` (its node's counter
    starts at 0 with each attempt): the next reading adds only what is past it."""
    disk_mb: float | None = None
    """MiB its run folders held at the newest disk check of its newest attempt (every
    `disk_check_s` while it runs, and once as each attempt ends; a gang's: every replica's), what
    `resources.disk_mb` is held against; None before the first check. An ended job keeps its
    last: what it left behind."""

    @property
    def name(self) -> str:
        return self.spec.name
