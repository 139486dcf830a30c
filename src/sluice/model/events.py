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
    """CPU actually consumed by a job's processes over the last sample interval (cores), and
    in all since its attempt began (`cpu_s`: the node's counter, so a lost sample or a plane
    that was down loses none of it; None where the engine does not count it)."""

    job_id: str
    attempt: int
    time: float
    cpu_cores: float
    memory_mb: float = 0.0
    cpu_s: float | None = None
    disk_mb: float | None = None
    """MiB its run folders held at the node's newest disk check (agent/disk_watch.py: blocks on
    disk, open files with no name too); None where none has measured it yet."""


@dataclass(frozen=True, slots=True)
class JobCheckpointed:
    job_id: str
    attempt: int
    time: float
    step: int
    path: str


MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class OomKill:
    """The kernel's OOM killer ended the attempt inside its memory cgroup: the job used more
    than its `resources.memory_mb`. Typed (not a phrase in the reason) so the controller and
    the user see the same facts: the limit, and the peak the cgroup recorded (None when the
    kernel keeps no peak, e.g. cgroup v2 before Linux 5.19)."""

    limit_mb: int
    peak_bytes: int | None = None

    def __str__(self) -> str:
        peak = "" if self.peak_bytes is None else f" (peak {self.peak_bytes / MIB:.0f} MiB)"
        return f"OOMKilled: exceeded memory limit {self.limit_mb} MiB{peak}"


@dataclass(frozen=True, slots=True)
class JobExited:
    """The job's process is gone. exit_code < 0 is a signal number (negated).

    node_lost: the process died because its node did (the raylet gone, the node dropped):
    the job resumes elsewhere from its checkpoint and no failure is counted. A typed flag,
    not a reason string, so rewording a message cannot turn node loss into a crash.
    oom: set when the kernel OOM-killed the job at its memory limit (a failure, retried per
    max_restarts like any other, reported as `OOMKilled: ...`).
    retryable: False when the attempt could not start for a reason a retry would meet again
    (its program, interpreter or workdir unreachable by the job's uid, a program not found):
    the job fails at once with that reason, its restarts untouched."""

    job_id: str
    attempt: int
    time: float
    exit_code: int
    reason: str = ""
    node_lost: bool = False
    oom: OomKill | None = None
    retryable: bool = True


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
