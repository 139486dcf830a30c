"""/v1/priority-classes: named job priorities (docs/queues.md). Every tenant may list them (it
needs the names to submit with them); creating and deleting is for admins."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel

from sluice.api.auth import CallerDep, PlaneDep
from sluice.api.schemas import ErrorOut, InvalidOut, PriorityClassOut
from sluice.spec import PriorityClassSpec

router = APIRouter(prefix="/v1/priority-classes", tags=["priority classes"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    403: {"model": ErrorOut, "description": "The caller is not an admin."},
    404: {"model": ErrorOut, "description": "No such priority class."},
    422: {"model": InvalidOut, "description": "A bad field, named."},
}


class PriorityClassList(BaseModel):
    items: list[PriorityClassOut]


@router.get("", response_model=PriorityClassList, responses=_ERRORS)
def list_priority_classes(plane: PlaneDep, caller: CallerDep) -> PriorityClassList:
    """Every priority class, by name (there are few: no paging)."""
    return PriorityClassList(items=[PriorityClassOut.of(p) for p in plane.list_priority_classes(caller)])


@router.post(
    "",
    status_code=201,
    response_model=PriorityClassOut,
    responses={**_ERRORS, 409: {"model": ErrorOut, "description": "It exists, or another class is the default."}},
)
def create_priority_class(plane: PlaneDep, caller: CallerDep, spec: PriorityClassSpec) -> PriorityClassOut:
    return PriorityClassOut.of(plane.create_priority_class(caller, spec))


@router.delete(
    "/{name}",
    status_code=204,
    responses={**_ERRORS, 409: {"model": ErrorOut, "description": "Unfinished jobs use it (named)."}},
)
def delete_priority_class(plane: PlaneDep, caller: CallerDep, name: str) -> Response:
    """Delete a class; refused while a job that has not finished uses it."""
    plane.delete_priority_class(caller, name)
    return Response(status_code=204)
