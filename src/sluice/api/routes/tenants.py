"""/v1/tenants (admin only): who may submit, and their tokens."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from sluice.api.auth import CallerDep, PlaneDep
from sluice.api.schemas import ErrorOut, NewTenantOut, TenantOut
from sluice.spec import TenantSpec

router = APIRouter(prefix="/v1/tenants", tags=["tenants"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    403: {"model": ErrorOut, "description": "The caller is not an admin."},
}


@router.get("", response_model=list[TenantOut], responses=_ERRORS)
def list_tenants(plane: PlaneDep, caller: CallerDep) -> list[TenantOut]:
    return [TenantOut.of(t) for t in plane.list_tenants(caller)]


@router.post(
    "",
    status_code=201,
    response_model=NewTenantOut,
    responses={**_ERRORS, 409: {"model": ErrorOut, "description": "A tenant of that name exists."}},
)
def create_tenant(plane: PlaneDep, caller: CallerDep, spec: TenantSpec) -> NewTenantOut:
    """Create a tenant. The response carries its token, once; sluice keeps only a hash."""
    record, token = plane.create_tenant(caller, spec)
    return NewTenantOut(**TenantOut.of(record).model_dump(), token=token)


@router.delete("/{name}", status_code=204, responses={**_ERRORS, 404: {"model": ErrorOut}})
def delete_tenant(plane: PlaneDep, caller: CallerDep, name: str) -> Response:
    plane.delete_tenant(caller, name)
    return Response(status_code=204)
