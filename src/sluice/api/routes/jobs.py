"""/v1/jobs: submit, list, inspect, cancel, explain, follow logs, progress."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from sluice.api.auth import CallerDep, PlaneDep
from sluice.api.contract import Plane
from sluice.api.schemas import ErrorOut, EventOut, InvalidOut, JobOut, jsonable
from sluice.control.errors import NotFound
from sluice.model import Phase
from sluice.spec import JobSpec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

FOLLOW_POLL_S = 0.25
"""How often a followed log is checked for new bytes (s)."""
MAX_LOG_BYTES = 8 * 1024 * 1024
"""A plain (not followed) log read returns at most this many trailing bytes."""

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing or unknown token."},
    404: {"model": ErrorOut, "description": "No such job (or it belongs to another tenant)."},
}


def _get(plane: Plane, caller: Any, job_id: str) -> Any:
    """The job, or the same 404 whether it does not exist or is another tenant's."""
    try:
        return plane.get_job(caller, job_id)
    except NotFound:
        raise NotFound(f"job {job_id} not found") from None


@router.post(
    "",
    status_code=201,
    response_model=JobOut,
    responses={422: {"model": InvalidOut, "description": "The spec is invalid; each bad field is named."}, **_ERRORS},
)
def submit(plane: PlaneDep, caller: CallerDep, spec: Annotated[JobSpec, Body()]) -> JobOut:
    """Submit a job. The body is a JobSpec (the same fields as a job YAML file)."""
    return JobOut.of(plane.submit(caller, spec))


@router.get("", response_model=list[JobOut], responses=_ERRORS)
def list_jobs(
    plane: PlaneDep,
    caller: CallerDep,
    phase: Annotated[list[Phase] | None, Query(description="Only jobs in these phases (repeatable).")] = None,
) -> list[JobOut]:
    """The caller's jobs (every tenant's for an admin), oldest first."""
    return [JobOut.of(j) for j in plane.list_jobs(caller, phases=phase or None)]


@router.get("/{job_id}", response_model=JobOut, responses=_ERRORS)
def get_job(plane: PlaneDep, caller: CallerDep, job_id: str) -> JobOut:
    return JobOut.of(_get(plane, caller, job_id))


@router.post("/{job_id}/cancel", response_model=JobOut, responses=_ERRORS)
def cancel(plane: PlaneDep, caller: CallerDep, job_id: str) -> JobOut:
    """Cancel a job: a queued job ends at once; a running one is asked to checkpoint and exit."""
    _get(plane, caller, job_id)
    return JobOut.of(plane.cancel(caller, job_id))


@router.get("/{job_id}/why", response_model=list[EventOut], responses=_ERRORS)
def why(plane: PlaneDep, caller: CallerDep, job_id: str) -> list[EventOut]:
    """The job's history with reasons: phase changes, placement, each CPU change, restarts."""
    _get(plane, caller, job_id)
    return [EventOut.of(e) for e in plane.why(caller, job_id)]


@router.get("/{job_id}/progress", responses=_ERRORS)
def progress(plane: PlaneDep, caller: CallerDep, job_id: str) -> dict[str, Any]:
    """The progress signals policies see: step, loss history, throughput, predicted remaining time."""
    _get(plane, caller, job_id)
    out = jsonable(plane.progress(caller, job_id))
    return out if isinstance(out, dict) else {}  # no report seen yet


def _read_from(path: Any, pos: int) -> tuple[bytes, int]:
    if not path:
        return b"", pos
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            data = f.read(MAX_LOG_BYTES)
    except FileNotFoundError:
        return b"", pos
    return data, pos + len(data)


@router.get(
    "/{job_id}/logs",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {}}}, **_ERRORS},
)
async def logs(
    request: Request,
    plane: PlaneDep,
    caller: CallerDep,
    job_id: str,
    follow: Annotated[bool, Query(description="Keep streaming new lines until the job ends.")] = False,
) -> Any:
    """The job's output (stdout and stderr). With follow=true the response streams until the job ends."""
    await to_thread.run_sync(_get, plane, caller, job_id)
    if not follow:
        path = await to_thread.run_sync(plane.log_path, caller, job_id)
        if not path or not Path(path).exists():
            return PlainTextResponse("")
        size = Path(path).stat().st_size
        data, _ = _read_from(path, max(0, size - MAX_LOG_BYTES))
        return PlainTextResponse(data.decode(errors="replace"))

    async def stream() -> AsyncIterator[bytes]:
        pos, current = 0, None
        while True:
            job = await to_thread.run_sync(plane.get_job, caller, job_id)
            path = await to_thread.run_sync(plane.log_path, caller, job_id)
            if path != current:  # a new attempt may write elsewhere
                current, pos = path, 0
            # Read after looking at the phase: a job that has ended has written all it will.
            while True:
                chunk, pos = _read_from(current, pos)
                if chunk:
                    yield chunk
                if len(chunk) < MAX_LOG_BYTES:
                    break
            if job.phase.terminal or await request.is_disconnected():
                return
            await asyncio.sleep(FOLLOW_POLL_S)

    return StreamingResponse(stream(), media_type="text/plain; charset=utf-8")
