"""TenantSpec: who owns jobs, and how much of the cluster they may hold."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from sluice.spec.base import Name, SpecModel

MAX_RUNNING_JOBS = 1_000_000
"""A quota above any real cluster; larger numbers are typos (and overflow a database integer)."""


class TenantSpec(SpecModel):
    name: Name
    admin: bool = False
    max_running_jobs: Annotated[
        int | None, Field(ge=1, le=MAX_RUNNING_JOBS, description="Quota on concurrently running jobs.")
    ] = None
    weight: Annotated[float, Field(gt=0, le=1000, description="Fair-share weight.")] = 1.0
