"""What the client returns: the API's own response models where the API publishes one
(sluice.api.schemas), and read models for the answers it sends as plain JSON objects
(nodes, queues, progress, warm reports).

The read models keep fields they do not know (`extra="allow"`), so a newer server's
additions survive `model_dump()`: the CLI's `-o json` prints what the server sent.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from sluice.api.schemas import (
    AssignmentOut,
    DatasetOut,
    DeletedOut,
    EventOut,
    FileEntryOut,
    JobFilesOut,
    JobOut,
    JobsDeletedOut,
    NewTenantOut,
    PriorityClassOut,
    TenantOut,
)

__all__ = [
    "AssignmentOut",
    "DatasetOut",
    "DeletedOut",
    "EventOut",
    "FaultOut",
    "FileEntryOut",
    "JobFilesOut",
    "JobOut",
    "JobsDeletedOut",
    "NewTenantOut",
    "NodeOut",
    "PriorityClassOut",
    "Progress",
    "QueueOut",
    "TenantOut",
    "UsageOut",
    "WarmNode",
    "WarmResult",
]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Progress(_Open):
    """A job's progress as the scheduler sees it (GET /v1/jobs/{id}/progress).

    loss_history: (time s, loss / max loss so far) pairs; usage_history: (time s, CPU cores
    used) pairs; report_history: (time s, step, loss) of each report; throughput: steps per
    second over the recent window (0 when unknown). Histories keep the last 240 points.
    rates: steps/s measured at each allocation shape the job held (gpus, nodes, replicas,
    steps_per_s, seconds, at), start-up excluded: what learned speed-up curves are fitted from.
    Each rate also carries the job's gradient noise scale and batch when it was measured
    (noise_scale, batch; None when the job reports none).
    restart_lost_s: seconds each recent resize or migration cost the job, measured from its
    reports (what restart-aware policies charge a change; empty before the first).
    noise_scale: the job's reported gradient noise scale (samples), a running mean; ref_batch:
    the batch its steps are counted in, if it says (both None otherwise)."""

    step: int = 0
    loss: float | None = None
    best_loss: float | None = None
    max_loss: float | None = None
    first_report: float | None = None
    last_report: float | None = None
    throughput: float = 0.0
    total_steps: int | None = None
    predicted_remaining_s: float | None = None
    io_stall_fraction: float = 0.0
    loss_history: list[tuple[float, float]] = []
    usage_history: list[tuple[float, float]] = []
    report_history: list[tuple[float, int, float | None]] = []
    rates: list[dict[str, float | None]] = []
    restart_lost_s: list[float] = []
    noise_scale: float | None = None
    ref_batch: float | None = None


class NodeOut(_Open):
    """A node: capacity, health and why, jobs and CPU handed out (None limits: unlimited)."""

    name: str
    cpu: float = 0.0
    gpus: int = 0
    health: str = ""
    reason: str = ""
    jobs: int = 0
    cpu_requested: float = 0.0
    cpu_limits: float | None = None


class FaultOut(_Open):
    """An injected fault (POST /v1/nodes/{name}/faults) or how many were stopped (DELETE)."""


class QueueOut(_Open):
    """A queue with its quotas and what it holds now (docs/queues.md)."""

    name: str
    cohort: str | None = None
    weight: float = 1.0
    nominal: dict[str, float] = {}
    borrowing_limit: dict[str, float] = {}
    lending_limit: dict[str, float] = {}
    reclaim_within_cohort: str = ""
    within_queue: str = ""
    max_runtime_s: float | None = None
    tenants: list[str] | None = None
    usage: dict[str, float] = {}
    borrowed: dict[str, float] = {}
    admitted: int = 0
    pending: int = 0
    summary: str = ""
    created_at: float = 0.0


class UsageOut(_Open):
    """One tenant's jobs in a usage report (`GET /v1/usage`): by phase, and what they held
    (GPU-hours; guaranteed core-hours of jobs without GPUs) and ran (hours)."""

    tenant: str
    jobs: int = 0
    phases: dict[str, int] = {}
    gpu_hours: float = 0.0
    core_hours: float = 0.0
    run_hours: float = 0.0
    cpu_used_hours: float = 0.0
    restarts: int = 0
    disk_mb: float = 0.0
    """MiB its jobs' run folders hold now (not of the window): what max_disk_mb is held against."""


class WarmNode(_Open):
    """What warming a dataset did on one node (`error` set when it failed there)."""

    node: str
    files_fetched: int = 0
    bytes_fetched: int = 0
    already_cached: int = 0
    seconds: float = 0.0
    cached_fraction: float = 0.0
    error: str | None = None


class WarmResult(_Open):
    name: str
    nodes: list[WarmNode]
