"""/v1/jobs/{id}/files: a job's files, listed and downloaded by its tenant (control/job_files.py
says what is shown and how it is read safely)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from sluice.api.auth import CallerDep, PlaneDep
from sluice.api.errors import error_body
from sluice.api.limits import tenant_slot
from sluice.api.schemas import ErrorOut, FileEntryOut, JobFilesOut
from sluice.control import job_files
from sluice.control.errors import NotFound
from sluice.model import JobUser

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

MAX_DOWNLOADS_PER_TENANT = 4
"""Downloads a tenant may have open at once; more is a 429 (each holds a file and a worker
thread while its client reads)."""
MAX_LISTINGS_PER_TENANT = 2
"""Listings a tenant may have in progress at once; more is a 429. Each reads a folder the job
filled as it liked (up to job_files.MAX_SCANNED names) in a worker thread: unbounded, one
tenant's many listings of a huge folder took every worker thread of the API (red team s29)."""

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing or unknown token."},
    404: {"model": ErrorOut, "description": "No such job, file or folder (or the job is another tenant's)."},
}

PathQ = Annotated[
    str,
    Query(
        max_length=job_files.MAX_PATH,
        description="A path in the job's folder, e.g. `work/model.pt` or `checkpoints` (empty: its top).",
    ),
]
ReplicaQ = Annotated[
    int | None, Query(ge=0, le=1023, description="A gang's replica (rank) whose folder to read; default 0.")
]


@router.get("/{job_id}/files", response_model=JobFilesOut, responses={429: {"model": ErrorOut}, **_ERRORS})
async def list_files(
    request: Request, plane: PlaneDep, caller: CallerDep, job_id: str, path: PathQ = "", replica: ReplicaQ = None
) -> Any:
    """The files and folders at `path` in the job's folder (the newest attempt's, on the node it
    ran on), by name. Read in a worker thread, at most MAX_LISTINGS_PER_TENANT at once."""
    folder, owner, elsewhere = await to_thread.run_sync(plane.job_folder, caller, job_id, replica)
    release = _slot(request, caller.name, "listings", MAX_LISTINGS_PER_TENANT)
    if release is None:
        return _too_many(f"{MAX_LISTINGS_PER_TENANT} listings in progress")
    try:
        body = await to_thread.run_sync(_listing, folder, path, owner, elsewhere)
    except job_files.WrongKind as err:
        raise NotFound(f"job {job_id}: {err}") from None
    except job_files.NoSuchFile:
        raise NotFound(f"job {job_id} has no folder {path!r}") from None
    finally:
        release()
    return Response(body, media_type="application/json")


def _listing(folder: Path, path: str, owner: JobUser | None, elsewhere: Mapping[str, Path]) -> bytes:
    """The listing as JSON, made in the worker thread: 10,000 names built, checked and written
    out on the event loop would hold every other request up for some 100 ms."""
    found = job_files.list_folder(folder, path, owner, elsewhere)
    return (
        JobFilesOut(
            path=found.path,
            entries=[FileEntryOut(name=e.name, kind=e.kind, size=e.size, modified=e.modified) for e in found.entries],
            cut=found.cut,
        )
        .model_dump_json()
        .encode()
    )


class _Download(StreamingResponse):
    """A file's bytes; once the response is over, however it ends (sent, client gone before
    the first byte, cancelled), the file is closed and the tenant's slot given back."""

    def __init__(self, reader: job_files.FileReader, name: str, release: Callable[[], None]) -> None:
        quoted = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name)
        super().__init__(
            _in_thread(reader),
            media_type="application/octet-stream",
            # No Content-Length: a file the job shrinks meanwhile ends early, not in a broken response.
            headers={"X-File-Size": str(reader.size), "Content-Disposition": f'attachment; filename="{quoted}"'},
        )
        self._reader = reader
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._reader.close()
            self._release()


async def _in_thread(reader: job_files.FileReader) -> AsyncIterator[bytes]:
    while (chunk := await to_thread.run_sync(reader.next_chunk)) is not None:
        yield chunk


def _slot(
    request: Request, tenant: str, kind: str = "downloads", most: int = MAX_DOWNLOADS_PER_TENANT
) -> Callable[[], None] | None:
    """One of the tenant's `most` slots of `kind` (downloads, listings), or None (`tenant_slot`)."""
    return tenant_slot(request, kind, tenant, most)


def _too_many(what: str) -> JSONResponse:
    detail = f"this tenant already has {what} (the most at once); wait for one to finish"
    return JSONResponse(error_body("too many requests", detail), status_code=429, headers={"Retry-After": "5"})


@router.get(
    "/{job_id}/files/content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}, 429: {"model": ErrorOut}, **_ERRORS},
)
async def download(
    request: Request, plane: PlaneDep, caller: CallerDep, job_id: str, path: PathQ, replica: ReplicaQ = None
) -> Any:
    """One file of the job's folder, as it was when the request came (a file the job is still
    writing is sent up to the size it had). Read in worker threads: a slow disk holds up this
    response only."""
    folder, owner, elsewhere = await to_thread.run_sync(plane.job_folder, caller, job_id, replica)
    release = _slot(request, caller.name)
    if release is None:
        return _too_many(f"{MAX_DOWNLOADS_PER_TENANT} downloads open")
    try:
        fd, size = await to_thread.run_sync(job_files.open_file, folder, path, owner, elsewhere)
    except job_files.WrongKind as err:
        release()
        raise NotFound(f"job {job_id}: {err}") from None
    except job_files.NoSuchFile:
        release()
        raise NotFound(f"job {job_id} has no file {path!r}") from None
    except BaseException:
        release()
        raise
    return _Download(job_files.FileReader(fd, size), path.rstrip("/").rsplit("/", 1)[-1], release)
