"""/v1/queues: queues with quotas, cohorts and grants (docs/queues.md). Everyone may list the
queues they may use; creating, changing, deleting and granting is for admins."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from sluice.api.auth import CallerDep, PlaneDep
from sluice.api.pagination import DEFAULT_LIMIT, CursorQ, LimitQ, Page, decode_cursor, page_of
from sluice.api.schemas import ErrorOut, InvalidOut
from sluice.control.queues import QueueStatus
from sluice.spec import GrantSpec, QueuePatch, QueueSpec

router = APIRouter(prefix="/v1/queues", tags=["queues"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    403: {"model": ErrorOut, "description": "The caller is not an admin."},
    404: {"model": ErrorOut, "description": "No such queue (or tenant)."},
    422: {"model": InvalidOut, "description": "A bad field, named."},
}


@router.get("", response_model=Page[QueueStatus], responses=_ERRORS)
def list_queues(
    plane: PlaneDep, caller: CallerDep, limit: LimitQ = DEFAULT_LIMIT, cursor: CursorQ = None
) -> Page[QueueStatus]:
    """Every queue (admin) or the caller's granted queues, with usage, borrowing and backlog,
    by name, a page at a time."""
    after = decode_cursor("queues", cursor, (str,))
    queues = sorted(plane.list_queues(caller), key=lambda q: q.name)
    rest = [q for q in queues if after is None or q.name > after[0]]
    page, nxt = page_of(rest[: limit + 1], limit, "queues", lambda q: (q.name,))
    return Page[QueueStatus](items=page, next_cursor=nxt)


@router.post("", status_code=201, response_model=QueueStatus, responses={**_ERRORS, 409: {"model": ErrorOut}})
def create_queue(plane: PlaneDep, caller: CallerDep, spec: QueueSpec) -> QueueStatus:
    return plane.create_queue(caller, spec)


@router.patch("/{name}", response_model=QueueStatus, responses=_ERRORS)
def update_queue(plane: PlaneDep, caller: CallerDep, name: str, patch: QueuePatch) -> QueueStatus:
    """Change quotas, cohort or weight live; admission uses them from the next round."""
    return plane.update_queue(caller, name, patch)


@router.delete(
    "/{name}",
    status_code=204,
    responses={
        **_ERRORS,
        409: {"model": ErrorOut, "description": "The queue has unfinished jobs, or is the built-in `default`."},
    },
)
def delete_queue(plane: PlaneDep, caller: CallerDep, name: str) -> Response:
    """Delete a queue with no unfinished jobs. The built-in `default` queue cannot be deleted."""
    plane.delete_queue(caller, name)
    return Response(status_code=204)


@router.post("/{name}/grants", response_model=QueueStatus, responses=_ERRORS)
def grant(plane: PlaneDep, caller: CallerDep, name: str, grant: GrantSpec) -> QueueStatus:
    """Grant a tenant the queue (or take it back with `granted: false`)."""
    return plane.grant_queue(caller, name, grant)
