"""Events engines report from `poll()`. Plain values, so every engine (and the sim) can make them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class JobStarted:
    job_id: str
    attempt: int
    node: str
    time: float
    pid: int | None = None


@dataclass(frozen=True, slots=True)
class JobProgress:
    """One `sdk.report()` line: step, loss and any other metrics the job reported."""

    job_id: str
    attempt: int
    time: float
    step: int
    loss: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobUsage:
    """CPU actually consumed by a job's processes over the last sample interval (cores)."""

    job_id: str
    attempt: int
    time: float
    cpu_cores: float
    memory_mb: float = 0.0


@dataclass(frozen=True, slots=True)
class JobCheckpointed:
    job_id: str
    attempt: int
    time: float
    step: int
    path: str


@dataclass(frozen=True, slots=True)
class JobExited:
    """The job's process is gone. exit_code < 0 is a signal number (negated)."""

    job_id: str
    attempt: int
    time: float
    exit_code: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class NodeUp:
    node: str
    time: float
    cpu: float
    gpus: int = 0
    memory_mb: int = 0
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeLost:
    node: str
    time: float
    reason: str


@dataclass(frozen=True, slots=True)
class NodeKPIs:
    """One KPI sample of a node (the health part models windows of these)."""

    node: str
    time: float
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class NodeCache:
    """The dataset cache state of a node: fraction of each dataset held, and free room."""

    node: str
    time: float
    datasets: dict[str, float]
    free_bytes: int


Event = JobStarted | JobProgress | JobUsage | JobCheckpointed | JobExited | NodeUp | NodeLost | NodeKPIs | NodeCache


def event_to_dict(e: Event) -> dict[str, Any]:
    from dataclasses import asdict

    return {"type": type(e).__name__, **asdict(e)}
