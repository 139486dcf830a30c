"""/v1/usage: what each tenant's jobs held and ran (accounting; control/usage.py)."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, Query

from sluice.api.auth import CallerDep, PlaneDep
from sluice.api.schemas import ErrorOut
from sluice.control.usage import TenantUsage
from sluice.spec import SpecError
from sluice.spec.errors import FieldProblem

router = APIRouter(prefix="/v1/usage", tags=["usage"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    403: {"model": ErrorOut, "description": "A tenant asked for another tenant's usage, or every tenant's."},
}


@router.get("", response_model=list[TenantUsage], responses=_ERRORS)
def usage(
    plane: PlaneDep,
    caller: CallerDep,
    since: Annotated[
        float | None,
        Query(
            description="The window's start, Unix time (seconds): hours held from the hour it falls in, jobs "
            "submitted at or after it."
        ),
    ] = None,
    tenant: Annotated[str | None, Query(max_length=63, description="One tenant (an admin may name any).")] = None,
    all_tenants: Annotated[
        bool,
        Query(
            alias="all",
            description="Every tenant's (admin): a 403 for a tenant's token, which would otherwise get its own only.",
        ),
    ] = False,
) -> list[TenantUsage]:
    """Per tenant: its jobs by phase, GPU-hours and guaranteed core-hours they held, hours they
    ran, and restarts. A tenant sees its own; an admin every tenant's."""
    if since is not None and not math.isfinite(since):
        raise SpecError([FieldProblem("since", "a Unix time in seconds, not NaN or infinite")])
    return plane.usage(caller, since=since, tenant=tenant, all_tenants=all_tenants)
