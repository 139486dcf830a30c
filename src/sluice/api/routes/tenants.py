"""/v1/tenants (admin only): who may submit, and their tokens."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from sluice.api.auth import CallerDep, PlaneDep
from sluice.api.pagination import DEFAULT_LIMIT, CursorQ, LimitQ, Page, decode_cursor, page_of
from sluice.api.schemas import ErrorOut, NewTenantOut, TenantOut
from sluice.spec import TenantPatch, TenantSpec

router = APIRouter(prefix="/v1/tenants", tags=["tenants"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    403: {"model": ErrorOut, "description": "The caller is not an admin."},
}


@router.get("", response_model=Page[TenantOut], responses=_ERRORS)
def list_tenants(
    plane: PlaneDep, caller: CallerDep, limit: LimitQ = DEFAULT_LIMIT, cursor: CursorQ = None
) -> Page[TenantOut]:
    """Every tenant, by name, a page at a time."""
    after = decode_cursor("tenants", cursor, (str,))
    tenants = plane.list_tenants(caller, after=after[0] if after else None, limit=limit + 1)
    page, nxt = page_of(tenants, limit, "tenants", lambda t: (t.name,))
    return Page[TenantOut](items=[TenantOut.of(t) for t in page], next_cursor=nxt)


@router.post(
    "",
    status_code=201,
    response_model=NewTenantOut,
    responses={
        **_ERRORS,
        409: {
            "model": ErrorOut,
            "description": "A tenant of that name exists or was deleted (a deleted tenant's name is never "
            "reused), or isolation is off and `force` was not given.",
        },
    },
)
def create_tenant(
    plane: PlaneDep,
    caller: CallerDep,
    spec: TenantSpec,
    force: Annotated[
        bool,
        Query(
            description="Create it although tenant isolation is off (the plane cannot run jobs as other users): "
            "every tenant's jobs can then read every other tenant's data."
        ),
    ] = False,
) -> NewTenantOut:
    """Create a tenant. The response carries its token, once; sluice keeps only a hash.
    Without tenant isolation a second tenant is refused (409, with the reason) unless forced."""
    record, token = plane.create_tenant(caller, spec, force=force)
    return NewTenantOut(**TenantOut.of(record).model_dump(), token=token)


@router.patch("/{name}", response_model=TenantOut, responses={**_ERRORS, 404: {"model": ErrorOut}})
def update_tenant(plane: PlaneDep, caller: CallerDep, name: str, patch: TenantPatch) -> TenantOut:
    """Change a tenant's fair-share weight, job limit (0 removes it) or priority cap
    (`"max_priority": null` removes it) live; only the fields given change."""
    return TenantOut.of(plane.update_tenant(caller, name, patch))


@router.delete(
    "/{name}",
    status_code=204,
    responses={
        **_ERRORS,
        404: {"model": ErrorOut},
        409: {
            "model": ErrorOut,
            "description": "The tenant is the caller, or still has unfinished jobs or datasets (named).",
        },
    },
)
def delete_tenant(plane: PlaneDep, caller: CallerDep, name: str) -> Response:
    """Delete a tenant: its token stops working and its queue grants go. Its name, like its uid,
    is never given to another tenant, so its jobs, logs and checkpoints (kept for an admin to
    read) never come to belong to anyone else."""
    plane.delete_tenant(caller, name)
    return Response(status_code=204)
