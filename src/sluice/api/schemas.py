"""What the API returns, as pydantic models (they make the OpenAPI docs) plus converters.

Domain records are dataclasses owned by the model and store; the API turns them into these
on the way out, so a field added to a record is not published until it is added here.
"""

from __future__ import annotations

import dataclasses
import math
import unicodedata
from collections.abc import Mapping
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sluice.model import JobRecord
from sluice.model.queue import PriorityClass, RuntimeLimit
from sluice.spec.base import RequestModel
from sluice.spec.job import JOB_ID_PATTERN


def jsonable(obj: Any) -> Any:
    """Plain JSON values from dataclasses, pydantic models, enums and mappings.
    Non-finite floats become null: JSON has no NaN, and a client must not choke on one."""
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: jsonable(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not callable(getattr(obj, f.name))
        }
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    return str(obj)


class AssignmentOut(BaseModel):
    node: str
    cpu_request: float
    cpu_limit: float | None
    gpus: int


REDACTED = "<redacted>"
"""What another tenant (an admin) sees in place of a job's env value."""


class JobOut(BaseModel):
    id: str
    tenant: str
    name: str
    phase: str
    reason: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    attempt: int
    restarts: int
    allocation: list[AssignmentOut] | None
    exit_code: int | None
    checkpoint: str | None
    step: int
    loss: float | None
    attained_service: float
    run_s: float = Field(
        0.0, description="Seconds run (Starting or Running), summed over attempts; held against max_runtime_s."
    )
    cpu_used_s: float = Field(
        0.0,
        description="CPU-seconds the job's processes used, summed over attempts, as its nodes count them "
        "(cgroup counters): what it used, beside what it held (attained_service).",
    )
    disk_mb: float | None = Field(
        None,
        description="MiB its run folders held at the newest disk check (every disk_check_s while it runs, "
        "and as each attempt ends), "
        "what resources.disk_mb is held against; a gang's: every replica's summed, while resources.disk_mb "
        "bounds each replica's on its own. An ended job keeps its last "
        "(what it left on disk until deleted). null: never measured.",
    )
    time_limit_s: float | None = Field(
        None,
        description="Seconds the job may run (run_s) before it is stopped and fails: the smaller of its "
        "max_runtime_s and its queue's. null: no limit.",
    )
    time_limit_of: Literal["job", "queue"] | None = Field(
        None, description="Whose max_runtime_s time_limit_s is: the job's own or its queue's."
    )
    spec: dict[str, Any]

    @staticmethod
    def of(job: JobRecord, viewer: str, limit: RuntimeLimit | None = None) -> JobOut:
        """The job as `viewer` (a tenant name) may see it: its env values are secrets of the
        job's own tenant, so anyone else (an admin) sees the names with the values redacted.
        `limit`: how long it may run (QueueService.runtime_limits)."""
        spec = job.spec.model_dump(mode="json")
        if viewer != job.tenant and spec.get("env"):
            spec["env"] = dict.fromkeys(spec["env"], REDACTED)
        return JobOut(
            id=job.id,
            tenant=job.tenant,
            name=job.spec.name,
            phase=job.phase.value,
            reason=job.reason,
            submitted_at=job.submitted_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            attempt=job.attempt,
            restarts=job.restarts,
            allocation=None if job.allocation is None else [AssignmentOut(**a) for a in job.allocation.to_list()],
            exit_code=job.exit_code,
            checkpoint=job.checkpoint,
            step=job.step,
            loss=job.loss if job.loss is None or math.isfinite(job.loss) else None,
            attained_service=job.attained_service,
            run_s=round(job.run_s, 3),
            cpu_used_s=round(job.cpu_used_s, 3),
            disk_mb=None if job.disk_mb is None else round(job.disk_mb, 3),
            time_limit_s=None if limit is None else limit.seconds,
            time_limit_of=None if limit is None else limit.of,
            spec=spec,
        )


class EventOut(BaseModel):
    seq: int = Field(
        description="The event's number in its job's history (1: the first). Not the store's sequence: that "
        "counts every tenant's events."
    )
    time: float
    kind: str = Field(description="phase, decision, exit, resize, node, ...")
    message: str = Field(description="What happened and why, in words.")
    job_id: str | None = None
    node: str | None = None
    data: dict[str, Any] = {}

    @staticmethod
    def of(e: Any, number: int) -> EventOut:
        return EventOut(
            seq=number,
            time=e.time,
            kind=e.kind,
            message=e.message,
            job_id=e.job_id,
            node=e.node,
            data=jsonable(e.data or {}),
        )


class TenantOut(BaseModel):
    """A tenant as anyone may see it: never the token or its hash."""

    name: str
    admin: bool
    max_running_jobs: int | None
    weight: float
    created_at: float
    max_priority: int | None = Field(
        default=None, description="The highest priority its jobs may have; null: no cap (admins are never capped)."
    )
    max_disk_mb: int | None = Field(
        default=None,
        description="MiB its jobs' run folders may hold, ended jobs' included, before its pending jobs wait; "
        "null: no cap.",
    )

    @staticmethod
    def of(t: Any) -> TenantOut:
        return TenantOut(
            name=t.name,
            admin=bool(t.admin),
            max_running_jobs=t.max_running_jobs,
            weight=float(t.weight),
            created_at=float(getattr(t, "created_at", 0.0)),
            max_priority=getattr(t, "max_priority", None),
            max_disk_mb=getattr(t, "max_disk_mb", None),
        )


class NewTenantOut(TenantOut):
    token: str = Field(description="The tenant's API token. Shown only now; only its hash is kept.")


class CordonIn(BaseModel):
    """`POST /v1/nodes/{name}/cordon`. The reason is shown in every moved job's `why` and in
    the node's history: one line of text, no control characters (a newline or an escape
    sequence would forge lines or recolour terminals there)."""

    model_config = ConfigDict(extra="forbid", strict=True, str_strip_whitespace=True)

    reason: str = Field(min_length=1, max_length=1000, description="Why the node is taken out of service.")

    @field_validator("reason", mode="before")
    @classmethod
    def _one_line_of_text(cls, v: Any) -> Any:
        if isinstance(v, str):
            if not v.strip():
                raise ValueError("may not be empty or only whitespace")
            bad = next((c for c in v if unicodedata.category(c) in _NOT_TEXT), None)
            if bad is not None:
                raise ValueError(
                    f"may not contain control characters (found {bad!r}): it is shown in moved jobs' reasons"
                )
        return v


_NOT_TEXT = frozenset({"Cc", "Cs", "Zl", "Zp"})
"""Unicode categories refused in one-line text: controls (newline, ESC, NUL), lone surrogates,
line and paragraph separators."""


class KpiBlameOut(BaseModel):
    """One KPI's part in a health alarm: its share of the attribution, its value in the alarm's
    sample, and the healthy mean and spread the node's model learned (absent for a loaded
    model whose scaler lacks the KPI)."""

    kpi: str
    share: float
    value: float
    healthy_mean: float | None = None
    healthy_spread: float | None = None


class AlarmWhyOut(BaseModel):
    time: float
    score: float
    threshold: float
    kpis: list[KpiBlameOut]
    sample_time: float | None = Field(
        default=None,
        description="When the sample the KPIs' values come from was taken: the least likely of the windows the "
        "score averages (`smooth`), which may be before `time` (absent for alarms kept from older sluice).",
    )


class NodeWhyOut(BaseModel):
    """`GET /v1/nodes/{name}/why` (`sluice node why`): the node's health and reason, and the
    newest counted alarm of the health monitor with the KPIs that drove it."""

    node: str
    health: str
    reason: str = ""
    monitored: bool = Field(description="False where no health monitor runs or it has not seen the node.")
    state: Literal["learning", "refitting", "scoring"] | None = Field(
        default=None,
        description="learning: the node's model waits for `train_samples` healthy samples and nothing is scored; "
        "refitting: a newer model is fitted while the old one scores; scoring.",
    )
    healthy_samples: int | None = Field(default=None, description="Healthy samples kept for the node's model.")
    train_samples: int | None = Field(default=None, description="Healthy samples a first model needs.")
    score: float | None = None
    scored_at: float | None = Field(default=None, description="Unix time of the sample `score` is of.")
    threshold: float | None = None
    alarms: int = 0
    held: int = 0
    alarm: AlarmWhyOut | None = None


class CancelIn(RequestModel):
    """The job array a request acts on (`POST /v1/jobs/cancel`: every job of it that has not
    ended; `POST /v1/jobs/delete`: every job of it, once all ended). Unknown fields refused."""

    array: str = Field(
        min_length=1,
        max_length=64,
        pattern=JOB_ID_PATTERN,
        description="The job array's id (`j-…`, what submit printed).",
    )


class FaultIn(RequestModel):
    """A fault to inject on a node (`sluice node fault`): exact types (`seconds: true` is
    refused), unknown fields refused."""

    kind: Literal["cpu", "memory", "io", "net"] = Field(
        description="cpu: busy loops on every core of the node; memory: hold and keep touching "
        "memory_mb of RAM; io: a write + fsync storm; net: a TCP flood to a loopback sink."
    )
    seconds: float = Field(gt=0, le=3600, description="How long the fault runs (seconds); it stops by itself.")
    workers: int | None = Field(
        default=None, ge=1, le=64, description="cpu/io/net worker processes (default: one per core of the node)."
    )
    memory_mb: int | None = Field(
        default=None, ge=1, le=1 << 20, description="RAM a memory fault holds (MiB); memory faults only. Default 512."
    )


class ProblemOut(BaseModel):
    field: str
    problem: str


class InvalidOut(BaseModel):
    error: str
    problems: list[ProblemOut]


class ErrorOut(BaseModel):
    error: str
    detail: str


class DatasetOut(BaseModel):
    """A dataset as its tenant (or an admin) sees it. Storage options can hold credentials,
    so only their names are ever returned."""

    tenant: str
    name: str
    source: str
    format: str
    cache: bool
    storage_option_names: list[str]
    created_at: float
    items: int | None
    total_bytes: int | None
    cached_fraction: float | None = None
    """Share of the dataset's bytes held by this node's cache (the control plane's node)."""
    cached_on: dict[str, float] = {}
    """Per node of the cluster (as its agent last reported, every few seconds): share of the
    dataset's bytes in that node's cache; nodes holding none are left out."""
    published: bool = False
    """Published by an admin to every tenant: any tenant may read and mount it by name."""
    cache_hits: dict[str, int] | None = None
    """Items jobs read from the node cache since the control plane started, by tier (`memory`,
    `disk`), as /metrics counts them. Only for the owner (or an admin): on a published dataset
    they add up every tenant's reads, which other tenants must not see. Else null."""
    cache_misses: int | None = None
    """Items jobs had to fetch from the source (same counting and visibility)."""
    hit_rate: float | None = None
    """hits / (hits + misses); null before any read is counted, or where the counters are hidden."""


class DeletedOut(BaseModel):
    name: str
    nodes: dict[str, str]
    """Per node, what dropping the dataset from its cache did ("removed", "not cached", or an error)."""


class JobsDeletedOut(BaseModel):
    """What `DELETE /v1/jobs/{id}` or `POST /v1/jobs/delete` forgot: the jobs (record and events)
    and how many run folders were removed with them. Shared with the Python client."""

    deleted: list[str]
    """The ids of the jobs deleted (an array's, lowest index first)."""
    folders: int
    """Run folders removed (a gang has one per replica; the simulator keeps none)."""


class FileEntryOut(BaseModel):
    name: str
    kind: Literal["file", "folder"]
    size: int = Field(description="Bytes of a file; 0 for a folder.")
    modified: float = Field(description="Unix time of its last change.")


class JobFilesOut(BaseModel):
    """One folder of a job's files: the job's HOME (`work/`), TMPDIR (`tmp/`) and what it made
    beside them (its checkpoints), never the plane's own files; links, FIFOs and files that are
    not the job's left out. Shared with the Python client."""

    path: str = Field(description="The folder listed, relative to the job's folder ('' for its top).")
    entries: list[FileEntryOut]
    cut: int = Field(0, description="Names left out past the most one listing shows, 10,000 (0: all shown).")


class PriorityClassOut(BaseModel):
    """A named priority class (docs/queues.md): the priority its jobs get and whether they
    may preempt lower ones. Shared with the Python client."""

    name: str
    value: int
    description: str
    preemption: Literal["allowed", "never"]
    default: bool
    created_at: float

    @staticmethod
    def of(p: PriorityClass) -> PriorityClassOut:
        return PriorityClassOut(
            name=p.name,
            value=p.value,
            description=p.description,
            preemption="allowed" if p.preempts else "never",
            default=p.default,
            created_at=p.created_at,
        )
