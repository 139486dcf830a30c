"""What an engine and a node agent exchange: node facts and launch requests."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.model.allocation import Allocation
from sluice.spec import JobSpec


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    cpu: float
    gpus: int = 0
    memory_mb: int = 0
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobUser:
    """The unprivileged identity a tenant's jobs run as (tenant isolation): a bare numeric
    uid/gid from the configured range, no supplementary groups, no login shell."""

    uid: int
    gid: int

    def __str__(self) -> str:
        return f"uid {self.uid}"


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """Everything a node needs to start one attempt of a job.

    checkpoint_dir: where the job saves/loads checkpoints (a path or fsspec URL every node
                    of the engine can reach); the SDK resumes from the newest one there.
    run_as:         the tenant's job user when isolation is on; None runs the job as the
                    node agent's own user.
    """

    job_id: str
    attempt: int
    tenant: str
    spec: JobSpec
    allocation: Allocation
    checkpoint_dir: str
    env: dict[str, str] = field(default_factory=dict)
    run_as: JobUser | None = None
