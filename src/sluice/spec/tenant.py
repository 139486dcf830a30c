"""TenantSpec: who owns jobs, and how much of the cluster they may hold."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from sluice.spec.job import NAME_PATTERN


class TenantSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    admin: bool = False
    max_running_jobs: Annotated[int | None, Field(ge=1, description="Quota on concurrently running jobs.")] = None
    weight: Annotated[float, Field(gt=0, le=1000, description="Fair-share weight.")] = 1.0
