"""QueueSpec: a queue with quotas, as an admin creates or changes it (docs/queues.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator

from sluice.spec.base import MAX_RUNTIME_S, MAX_WEIGHT, MIN_WEIGHT, Name, NameOrEmpty, RequestModel

_BIG = 1_000_000_000.0
"""Above any real cluster; larger numbers are typos."""


QUEUE_NULL_HINTS = {
    "cohort": '"" takes the queue out of its cohort',
    "nominal": "{} removes every nominal quota",
    "borrowing_limit": "{} removes every borrowing limit",
    "lending_limit": "{} removes every lending limit",
}
"""What a patch writes instead of null to clear a queue field (only max_runtime_s takes null)."""

TENANT_NULL_HINTS = {"max_running_jobs": "0 removes the limit", "max_disk_mb": "0 removes the cap"}
"""What a patch writes instead of null to clear a tenant field (only max_priority takes null)."""


def _not_null(v: object, info: ValidationInfo, hints: dict[str, str]) -> object:
    """Refuse an explicit null in a patch field that has no null: it was read as "leave it as it
    is", so `{"max_running_jobs": null}` answered 200 and changed nothing."""
    if v is None:
        name = info.field_name or ""
        hint = hints.get(name)
        instead = f"; {hint}" if hint else ""
        raise ValueError(f"null is not a value here: leave {name} out to keep it{instead}")
    return v


class QuotaSpec(RequestModel):
    """An amount per quota resource; a resource left out has no limit."""

    cores: Annotated[float | None, Field(ge=0, le=_BIG, description="Guaranteed CPU cores (cpu.min x replicas).")] = (
        None
    )
    memory_mb: Annotated[int | None, Field(ge=0, le=int(_BIG), description="Memory in MiB.")] = None
    gpus: Annotated[int | None, Field(ge=0, le=1_000_000, description="GPUs.")] = None
    jobs: Annotated[int | None, Field(ge=0, le=1_000_000, description="Admitted jobs.")] = None


class PreemptionSpec(RequestModel):
    """When a queue's pending jobs may take quota back by preempting running ones (they
    checkpoint, stop and requeue). Kueue's `preemption` block, with its names."""

    reclaim_within_cohort: Annotated[
        Literal["any", "lower_priority", "never"],
        Field(
            description="A job within its nominal quota preempts other queues' borrowing jobs: any of them, "
            "only those of lower priority, or never (it waits for them to finish)."
        ),
    ] = "any"
    within_queue: Annotated[
        Literal["lower_priority", "never"],
        Field(description="A job preempts lower-priority jobs of its own queue, or never."),
    ] = "lower_priority"


class QueueSpec(RequestModel):
    """A queue: a nominal quota, the cohort it borrows from and lends to, and its weight."""

    name: Name
    cohort: Annotated[Name | None, Field(description="Queues of one cohort share.")] = None
    nominal: QuotaSpec = QuotaSpec()
    borrowing_limit: Annotated[
        QuotaSpec, Field(description="Most it may use above its nominal quota (unset: whatever the cohort lends).")
    ] = QuotaSpec()
    lending_limit: Annotated[
        QuotaSpec, Field(description="Most of its unused nominal quota others may borrow (unset: all of it).")
    ] = QuotaSpec()
    weight: Annotated[
        float,
        Field(ge=MIN_WEIGHT, le=MAX_WEIGHT, description="Fair-share weight within its cohort (0.001 to 1000)."),
    ] = 1.0
    preemption: PreemptionSpec = PreemptionSpec()
    max_runtime_s: Annotated[
        float | None,
        Field(
            gt=0,
            le=MAX_RUNTIME_S,
            description="Most seconds a job of this queue may run (Slurm's partition MaxTime): a job without "
            "max_runtime_s gets this one, a job asking for more is refused at submit. Unset: no limit.",
        ),
    ] = None


class QueuePatch(RequestModel):
    """A live change to a queue: only the fields given change. A quota given replaces the
    queue's quota of that kind; `cohort: ""` takes the queue out of its cohort."""

    cohort: NameOrEmpty | None = None
    nominal: QuotaSpec | None = None
    borrowing_limit: QuotaSpec | None = None
    lending_limit: QuotaSpec | None = None
    weight: Annotated[float | None, Field(ge=MIN_WEIGHT, le=MAX_WEIGHT)] = None
    preemption: PreemptionSpec | None = None
    max_runtime_s: Annotated[
        float | None,
        Field(gt=0, le=MAX_RUNTIME_S, description="A new limit; null removes it. Running jobs are held to it too."),
    ] = None

    @field_validator("cohort", "nominal", "borrowing_limit", "lending_limit", "weight", "preemption", mode="before")
    @classmethod
    def _no_null(cls, v: object, info: ValidationInfo) -> object:
        return _not_null(v, info, QUEUE_NULL_HINTS)


class GrantSpec(RequestModel):
    """Grant (or, with granted=false, take back) the use of a queue to a tenant."""

    tenant: Name
    granted: bool = True


class PriorityClassSpec(RequestModel):
    """A named priority class (Kueue's WorkloadPriorityClass): jobs name it with
    `priority_class` and get its value as their priority."""

    name: Name
    value: Annotated[int, Field(ge=-1000, le=1000, description="The priority its jobs get (higher goes first).")]
    description: Annotated[str, Field(max_length=256)] = ""
    preemption: Annotated[
        Literal["allowed", "never"],
        Field(description="Whether its jobs may preempt lower-priority jobs (never: they only go first in line)."),
    ] = "allowed"
    default: Annotated[
        bool, Field(description="Applied to jobs that set neither priority nor priority_class (one class at most).")
    ] = False


class TenantPatch(RequestModel):
    """A live change to a tenant's share: only the fields given change."""

    weight: Annotated[
        float | None, Field(ge=MIN_WEIGHT, le=MAX_WEIGHT, description="Fair-share weight (0.001 to 1000).")
    ] = None
    max_running_jobs: Annotated[int | None, Field(ge=0, le=1_000_000, description="0 removes the limit.")] = None
    max_disk_mb: Annotated[
        int | None, Field(ge=0, le=1024**3, description="MiB its jobs' run folders may hold; 0 removes the cap.")
    ] = None
    max_priority: Annotated[
        int | None,
        Field(
            ge=-1000,
            le=1000,
            description="The highest priority its jobs may have; an explicit null removes the cap.",
        ),
    ] = None

    @field_validator("weight", "max_running_jobs", "max_disk_mb", mode="before")
    @classmethod
    def _no_null(cls, v: object, info: ValidationInfo) -> object:
        return _not_null(v, info, TENANT_NULL_HINTS)
