"""TenantSpec: who owns jobs, and how much of the cluster they may hold."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from sluice.spec.base import MAX_WEIGHT, MIN_WEIGHT, Name, RequestModel

MAX_RUNNING_JOBS = 1_000_000
"""A quota above any real cluster; larger numbers are typos (and overflow a database integer)."""
MAX_TENANT_DISK_MB = 1024**3
"""1 PiB, as `resources.disk_mb`: a cap above any disk; larger numbers are typos."""


class TenantSpec(RequestModel):
    name: Name
    admin: bool = False
    max_running_jobs: Annotated[
        int | None,
        Field(ge=0, le=MAX_RUNNING_JOBS, description="Quota on jobs admitted at once; 0 or unset: no limit."),
    ] = None
    weight: Annotated[float, Field(ge=MIN_WEIGHT, le=MAX_WEIGHT, description="Fair-share weight (0.001 to 1000).")] = (
        1.0
    )

    max_priority: Annotated[
        int | None,
        Field(
            ge=-1000,
            le=1000,
            description="The highest priority its jobs may have (bare `priority` or a class's value), checked at "
            "submit and resume; unset: no cap, so its jobs may preempt other tenants' lower-priority jobs in a "
            "shared queue.",
        ),
    ] = None

    max_disk_mb: Annotated[
        int | None,
        Field(
            ge=0,
            le=MAX_TENANT_DISK_MB,
            description="Most MiB its jobs' run folders may hold on disk, ended jobs' included (what each held at "
            "its last check): at or past it, its pending jobs wait until it deletes some (sluice job delete); "
            "0 or unset: no cap.",
        ),
    ] = None

    @field_validator("max_running_jobs", "max_disk_mb")
    @classmethod
    def _zero_is_no_limit(cls, v: int | None) -> int | None:
        # As `tenant set --max-running-jobs 0` (TenantPatch): 0 means no limit, kept as none.
        return v or None
