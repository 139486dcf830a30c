"""/v1/jobs: submit, list, inspect, cancel, delete, explain, follow logs, progress."""

from __future__ import annotations

import asyncio
import codecs
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BeforeValidator
from starlette.types import Receive, Scope, Send

from sluice.api import job_logs, pagination
from sluice.api.auth import CallerDep, PlaneDep
from sluice.api.errors import error_body
from sluice.api.limits import tenant_slot
from sluice.api.pagination import DEFAULT_LIMIT, CursorQ, LimitQ, Page, decode_cursor, page_of
from sluice.api.schemas import CancelIn, ErrorOut, EventOut, InvalidOut, JobOut, JobsDeletedOut, jsonable
from sluice.control.errors import NotFound
from sluice.control.plane import ControlPlane
from sluice.model import JobRecord, Phase
from sluice.spec import JobSpec
from sluice.spec.errors import FieldProblem, SpecError
from sluice.spec.job import JOB_ID_PATTERN, job_ref

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

FOLLOW_POLL_S = 0.25
"""How often a followed log is checked for new bytes (s)."""
FOLLOW_CHUNKS_PER_ROUND = 16
"""A followed all-replicas view reads at most this many LOG_CHUNKs (1 MiB) of one replica's
log before turning to the next replica's."""
FOLLOW_HELD_BYTES = 1024 * 1024
"""A followed all-replicas view holds at most this many bytes of its ranks' partial lines in
all (each rank its share, at most job_logs.LONGEST_LINE): at 64 KiB a rank, a 1,024-replica
gang's view held 64 MiB, and a tenant's 16 of them 1 GiB of the server's memory."""
MAX_LOG_STREAMS_PER_TENANT = 16
"""Log responses (plain or followed) a tenant may have open at once; more is a 429. A followed
log polls its job every FOLLOW_POLL_S for as long as the client stays, so without a bound one
tenant's thousands of idle followers slowed every tenant's requests."""

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing or unknown token."},
    404: {"model": ErrorOut, "description": "No such job (or it belongs to another tenant)."},
}


async def _until_deleted(job_id: str, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A followed log whose job is deleted meanwhile (it may be, in the half second between its
    end and the follower's next look) ends with a line saying so; it used to break off with
    the NotFound, a chunked response cut short."""
    try:
        async for chunk in chunks:
            yield chunk
    except NotFound:
        yield f"[sluice] job {job_id} was deleted while followed\n".encode()


def _get(plane: ControlPlane, caller: Any, job_id: str) -> Any:
    """The job, or the same 404 whether it does not exist or is another tenant's."""
    try:
        return plane.get_job(caller, job_id)
    except NotFound:
        raise NotFound(f"job {job_ref(job_id)} not found{plane.array_hint(caller, job_id)}") from None


def _out(plane: ControlPlane, caller: Any, job: JobRecord) -> JobOut:
    """The job as the caller sees it, with how long it may run."""
    return _outs(plane, caller, [job])[0]


def _outs(plane: ControlPlane, caller: Any, jobs: list[JobRecord]) -> list[JobOut]:
    """`_out` of each job, the queues' limits read once."""
    limits = plane.queues.runtime_limits(jobs)
    return [JobOut.of(j, caller.name, limits[j.id]) for j in jobs]


@router.post(
    "",
    status_code=201,
    response_model=JobOut,
    responses={422: {"model": InvalidOut, "description": "The spec is invalid; each bad field is named."}, **_ERRORS},
)
def submit(plane: PlaneDep, caller: CallerDep, spec: Annotated[JobSpec, Body()]) -> JobOut:
    """Submit a job. The body is a JobSpec (the same fields as a job YAML file)."""
    return _out(plane, caller, plane.submit(caller, spec))


_LIST_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    422: {"model": InvalidOut, "description": "A bad query parameter (limit, cursor, phase), named."},
}


def _phase_any_case(v: Any) -> Any:
    """`running`, `RUNNING` and `Running` are the phase Running (as the CLI takes them)."""
    if isinstance(v, str):
        return next((p for p in Phase if p.value.lower() == v.lower()), v)
    return v


@router.get("", response_model=Page[JobOut], responses=_LIST_ERRORS)
def list_jobs(
    plane: PlaneDep,
    caller: CallerDep,
    phase: Annotated[
        list[Annotated[Phase, BeforeValidator(_phase_any_case)]] | None,
        Query(max_length=len(Phase), description="Only jobs in these phases (repeatable, any case)."),
    ] = None,
    limit: LimitQ = DEFAULT_LIMIT,
    cursor: CursorQ = None,
    array: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=64,
            pattern=JOB_ID_PATTERN,
            description="Only the jobs of this job array (its id): read by id, not by walking your whole list. "
            "Another tenant's array (or one that never was) is a 404; an admin sees any.",
        ),
    ] = None,
) -> Page[JobOut]:
    """The caller's jobs (every tenant's for an admin), oldest first, a page at a time."""
    after = decode_cursor("jobs", cursor, (float, str))
    phases = phase or None

    def read(key: tuple[float, str] | None, ask: int) -> list[JobRecord]:
        if array is None:
            return plane.list_jobs(caller, phases=phases, after=key, limit=ask)
        return plane.array_jobs(caller, array, phases, after=key, limit=ask)

    jobs = _fetch_jobs(read, after, limit + 1)
    page, nxt = page_of(jobs, limit, "jobs", lambda j: (j.submitted_at, j.id), _job_bytes)
    return Page[JobOut](items=_outs(plane, caller, page), next_cursor=nxt)


JOB_BATCH = 50
"""Jobs read from the plane at a time while a page is filled."""


def _fetch_jobs(read: Callable[[Any, int], list[Any]], after: Any, want: int) -> list[Any]:
    """Up to `want` jobs after `after` (`read(after, n)`: the next n), read JOB_BATCH at a
    time and no more once they pass the page's byte budget (a page of a thousand 1 MiB specs
    read them all, 1 GB, to send a few: red-team pass 6). Past the budget it keeps at least
    two, so `page_of` can tell that more follow."""
    out: list[Any] = []
    total = 0
    while len(out) < want:
        ask = min(JOB_BATCH, want - len(out))
        if total > pagination.MAX_PAGE_BYTES:
            ask = min(ask, 2 - len(out))
            if ask <= 0:
                break
        batch = read(after, ask)
        out += batch
        total += sum(_job_bytes(j) for j in batch)
        if len(batch) < ask:
            break
        after = (batch[-1].submitted_at, batch[-1].id)
    return out


def _job_bytes(job: Any) -> int:
    """A job's size in a page, about: its spec's free-form strings (argv, env, labels: up to
    about 1 MiB in all; workdir, checkpoint location and the checkpoint path) as the response
    encodes them, and a bound for the rest of the record.
    Counted as encoded, not as characters: a control character is six bytes of JSON (`\\u0001`)
    and a character up to four of UTF-8, so a page counted in characters could be ~6x the
    budget."""
    spec = job.spec
    text = sum(_wire(a) + 1 for a in spec.command)
    text += sum(_wire(k) + _wire(v) + 2 for d in (spec.env, spec.labels) for k, v in d.items())
    text += _wire(spec.checkpoint.location or "") + _wire(job.checkpoint or "")  # up to 1 kB each
    return 1024 + text + _wire(spec.workdir or "") + _wire(job.reason or "")


def _wire(s: str) -> int:
    """Bytes of `s` in the JSON response (quotes and escapes included: Starlette's encoding)."""
    return len(json.dumps(s, ensure_ascii=False).encode("utf-8", "surrogatepass"))


@router.get("/{job_id}", response_model=JobOut, responses=_ERRORS)
def get_job(plane: PlaneDep, caller: CallerDep, job_id: str) -> JobOut:
    return _out(plane, caller, _get(plane, caller, job_id))


@router.post("/cancel", response_model=list[JobOut], responses=_ERRORS)
def cancel_many(plane: PlaneDep, caller: CallerDep, body: CancelIn) -> list[JobOut]:
    """Cancel every job of a job array that has not ended (`{"array": ID}`), in one request: the
    jobs cancelled, lowest index first (an empty list when all had ended). Another tenant's
    array is a 404, as its jobs are."""
    return _outs(plane, caller, plane.cancel_array(caller, body.array))


@router.post("/{job_id}/cancel", response_model=JobOut, responses=_ERRORS)
def cancel(plane: PlaneDep, caller: CallerDep, job_id: str) -> JobOut:
    """Cancel a job: a queued job ends at once; a running one is asked to checkpoint and exit."""
    _get(plane, caller, job_id)
    return _out(plane, caller, plane.cancel(caller, job_id))


_DELETE_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    409: {"model": ErrorOut, "description": "Not ended, one job of an array, or a live job starts after it."},
}


@router.delete("/{job_id}", response_model=JobsDeletedOut, responses=_DELETE_ERRORS)
def delete(plane: PlaneDep, caller: CallerDep, job_id: str) -> JobsDeletedOut:
    """Forget an ended job now, as retention does after `job_retention_days`: its record and
    events, then its run folders (log, files, the checkpoints kept there). 409, deleting
    nothing, while it has not ended, for one job of an array (`POST /v1/jobs/delete`), or
    while a job not yet ended starts after it."""
    done = plane.delete_job(caller, job_id)
    return JobsDeletedOut(deleted=done.ids, folders=done.folders)


@router.post("/delete", response_model=JobsDeletedOut, responses=_DELETE_ERRORS)
def delete_many(plane: PlaneDep, caller: CallerDep, body: CancelIn) -> JobsDeletedOut:
    """Forget every job of a job array (`{"array": ID}`) once all of them ended, in one request.
    Another tenant's array is a 404, as its jobs are."""
    done = plane.delete_array(caller, body.array)
    return JobsDeletedOut(deleted=done.ids, folders=done.folders)


@router.post("/{job_id}/suspend", response_model=JobOut, responses={**_ERRORS, 409: {"model": ErrorOut}})
def suspend(plane: PlaneDep, caller: CallerDep, job_id: str) -> JobOut:
    """Suspend a job: it checkpoints, stops and gives its quota back until resumed."""
    _get(plane, caller, job_id)
    return _out(plane, caller, plane.suspend(caller, job_id))


@router.post("/{job_id}/resume", response_model=JobOut, responses={**_ERRORS, 409: {"model": ErrorOut}})
def resume(plane: PlaneDep, caller: CallerDep, job_id: str) -> JobOut:
    """Resume a suspended job: admitted again, it starts from its checkpoint. 409 while its
    tenant is no longer granted its queue (it stays Suspended)."""
    _get(plane, caller, job_id)
    return _out(plane, caller, plane.resume(caller, job_id))


@router.get("/{job_id}/why", response_model=Page[EventOut], responses=_LIST_ERRORS)
def why(
    plane: PlaneDep, caller: CallerDep, job_id: str, limit: LimitQ = DEFAULT_LIMIT, cursor: CursorQ = None
) -> Page[EventOut]:
    """The job's history with reasons (phase changes, placement, each CPU change, restarts),
    oldest first, a page at a time."""
    _get(plane, caller, job_id)
    after = decode_cursor("job-events", cursor, (int,))
    if after and after[0] < 1:  # the count of events a page sent: never below 1
        raise pagination.bad_cursor("not a cursor of the job-events list")
    sent = after[0] if after else 0  # the job's events already sent
    events = plane.why(caller, job_id, skip=sent, limit=limit + 1)
    numbered = list(enumerate(events, start=sent + 1))
    page, nxt = page_of(numbered, limit, "job-events", lambda ne: (ne[0],))
    return Page[EventOut](items=[EventOut.of(e, n) for n, e in page], next_cursor=nxt)


@router.get("/{job_id}/progress", responses=_ERRORS)
def progress(plane: PlaneDep, caller: CallerDep, job_id: str) -> dict[str, Any]:
    """The progress signals policies see: step, loss history, throughput, predicted remaining time."""
    _get(plane, caller, job_id)
    out = jsonable(plane.progress(caller, job_id))
    return out if isinstance(out, dict) else {}  # no report seen yet


class _CountedStream(StreamingResponse):
    """A streaming response that calls `release` once it is over, however it ends (sent,
    client gone, cancelled)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/plain; charset=utf-8")
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def _read_in_thread(parts: list[job_logs.Segment]) -> AsyncIterator[bytes]:
    """The pieces of `parts`, each read in a worker thread: a log on a slow or hung file
    system (a Ray runs folder on NFS) then holds up its own response, not the event loop that
    serves every tenant's requests."""
    async for chunk in _next_in_thread(job_logs.pieces(parts)):
        yield chunk


async def _next_in_thread(it: Iterator[bytes]) -> AsyncIterator[bytes]:
    while (chunk := await to_thread.run_sync(next, it, None)) is not None:
        yield chunk


def _as_text(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """UTF-8 text (invalid bytes replaced), a piece at a time."""

    async def text() -> AsyncIterator[bytes]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        async for chunk in chunks:
            yield decoder.decode(chunk).encode()
        yield decoder.decode(b"", final=True).encode()

    return text()


def _all_replicas(
    request: Request,
    plane: ControlPlane,
    caller: Any,
    job_id: str,
    logs: list[Path | None],
    follow: bool,
    tail: int | None,
) -> Any:
    """Every replica's log of the newest attempt, each line prefixed `[rankK] ` (engines with a
    log per replica). Read: the replicas one after another, in rank order, each its share of
    MAX_LOG_BYTES (or its last `tail` lines). Followed: then each replica's new lines as they
    come, whole, so that ranks interleave as they write, until the job ends."""
    release = _log_slot(request, caller.name)
    if release is None:
        return _too_many()
    # Their shares add up to MAX_LOG_BYTES, however many replicas have a log: with a floor of a
    # LOG_CHUNK each, 1,024 replicas read 64 MiB a request (red team s22).
    budget = job_logs.MAX_LOG_BYTES // max(sum(p is not None for p in logs), 1)

    def start(attempt: int) -> tuple[list[int | None], list[list[job_logs.Segment]]]:
        """Where each replica's newest attempt starts in its log (None: it has no record
        there yet), and what of it a read returns. A replica's log on Ray also holds the
        earlier attempts that ran its rank on that node: those are not the newest attempt's."""
        starts: list[int | None] = []
        parts: list[list[job_logs.Segment]] = []
        for p in logs:
            mine = job_logs.of_attempt(p, attempt) if p else None
            starts.append(None if mine is None else mine.start)
            parts.append(job_logs.segments([mine], tail, budget) if mine else [])
        return starts, parts

    if not follow:

        async def read() -> AsyncIterator[bytes]:
            job = await to_thread.run_sync(plane.get_job, caller, job_id)
            _, parts = await to_thread.run_sync(start, job.attempt)
            async for chunk in _next_in_thread(job_logs.prefixed(parts)):
                yield chunk

        return _CountedStream(_as_text(read()), release)

    async def stream() -> AsyncIterator[bytes]:
        current = list(logs)
        finders = [job_logs.AttemptStartFinder() for _ in current]
        lines = [job_logs.LinePrefixer(f"[rank{k}] ".encode(), _held_share(len(current))) for k in range(len(current))]
        job = await to_thread.run_sync(plane.get_job, caller, job_id)
        # Where each replica's log is read from next; None: its newest attempt has no record
        # there yet (the log holds only earlier attempts' output).
        pos, parts_now = await to_thread.run_sync(start, job.attempt)
        if tail is not None:  # the tail of each as it is now, then what follows
            for k, parts in enumerate(parts_now):
                pos[k] = parts[-1].end if parts else pos[k]
                async for chunk in _read_in_thread(parts):
                    out = lines[k].feed(chunk)
                    if out:
                        yield out
        attempt = None
        while True:
            job = await to_thread.run_sync(plane.get_job, caller, job_id)
            # Where each replica logs is looked up again only when that can have changed (a
            # new attempt, a replica not started yet): on Ray it is a search of the runs folder.
            if job.attempt != attempt or None in current:
                found = await to_thread.run_sync(plane.replica_logs, caller, job_id) or []
                attempt = job.attempt
            else:
                found = current
            for k in range(len(current), len(found)):  # resized to more replicas: follow theirs too
                current.append(None)
                finders.append(job_logs.AttemptStartFinder())
                lines.append(job_logs.LinePrefixer(f"[rank{k}] ".encode()))
                pos.append(None)
            for held in lines:  # the ranks share FOLLOW_HELD_BYTES, however many there are now
                held.longest = min(held.longest, _held_share(len(lines)))
            behind = False  # a replica has more than one round's share unread: no pause
            for k, path in enumerate(found):
                if path != current[k] or (path is not None and pos[k] is None):
                    # A new attempt writes elsewhere, or has not started in this log yet: from
                    # where it starts there, never from the log's start (earlier attempts').
                    begin = await to_thread.run_sync(finders[k].find, path, job.attempt) if path else None
                    current[k], pos[k] = path, begin
                # At most FOLLOW_CHUNKS_PER_ROUND of one replica before the next one's turn: a
                # replica that wrote faster than the server read held the loop on its rank, and
                # the others' lines waited behind it (red team s22).
                here = pos[k]
                if here is None:
                    continue
                for _ in range(FOLLOW_CHUNKS_PER_ROUND):
                    chunk, after = await to_thread.run_sync(job_logs.read_from, current[k], here)
                    pos[k] = here = after
                    out = lines[k].feed(chunk)
                    if out:
                        yield out
                    if len(chunk) < job_logs.LOG_CHUNK:
                        break
                else:
                    behind = True
            if await request.is_disconnected() or (job.phase.terminal and not behind):
                for held in lines:
                    out = held.flush()
                    if out:
                        yield out
                return
            if not behind:
                await asyncio.sleep(FOLLOW_POLL_S)

    return _CountedStream(_until_deleted(job_id, stream()), release)


def _held_share(ranks: int) -> int:
    """How much of its partial line each of `ranks` replicas' followed view may hold."""
    return min(job_logs.LONGEST_LINE, max(1, FOLLOW_HELD_BYTES // max(ranks, 1)))


def _log_slot(request: Request, tenant: str) -> Callable[[], None] | None:
    """One of the tenant's MAX_LOG_STREAMS_PER_TENANT log slots, or None (`tenant_slot`)."""
    return tenant_slot(request, "log_streams", tenant, MAX_LOG_STREAMS_PER_TENANT)


def _too_many() -> JSONResponse:
    detail = (
        f"this tenant already has {MAX_LOG_STREAMS_PER_TENANT} log responses open (the most at once); "
        "close one or retry later"
    )
    return JSONResponse(error_body("too many requests", detail), status_code=429, headers={"Retry-After": "5"})


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
    tail: Annotated[
        int | None,
        Query(
            ge=1,
            le=job_logs.MAX_TAIL_LINES,
            description=f"Only the last N lines (1 to {job_logs.MAX_TAIL_LINES}); with follow, then the new ones.",
        ),
    ] = None,
    replica: Annotated[
        int | None,
        Query(
            ge=0,
            le=1023,
            description="Only this replica's output, of the newest attempt (engines that keep a log per "
            "replica: Ray; the local engine's one log prefixes each replica's lines with [rankK]).",
        ),
    ] = None,
    all_replicas: Annotated[
        bool,
        Query(
            description="Every replica's output of the newest attempt, each line prefixed [rankK]: on engines "
            "that keep a log per replica (Ray) the replicas in rank order, and followed, their lines as they "
            "come. The local engine's one log already is that view and is returned as it is.",
        ),
    ] = False,
) -> Any:
    """The job's output (stdout and stderr), every attempt's, oldest first (a gang's: rank
    0's, `replica`'s, or with `all_replicas` every rank's). With follow=true the response
    streams until the job ends."""
    job = await to_thread.run_sync(_get, plane, caller, job_id)
    if all_replicas:
        if replica is not None:
            raise SpecError([FieldProblem("all_replicas", "give replica or all_replicas, not both")])
        per_rank = await to_thread.run_sync(plane.replica_logs, caller, job_id)
        if per_rank is not None:
            return _all_replicas(request, plane, caller, job_id, per_rank, follow, tail)

    def newest() -> Any:
        return plane.log_path(caller, job_id) if replica is None else plane.replica_log(caller, job_id, replica)

    earlier = [] if replica is not None else await to_thread.run_sync(plane.earlier_logs, caller, job_id)
    if not follow:
        path = await to_thread.run_sync(newest)
        # The slot before the first read of the files: a read on a hung file system holds a
        # worker thread, and a tenant's 17th such request must be refused, not add another.
        release = _log_slot(request, caller.name)
        if release is None:
            return _too_many()

        def read_parts() -> list[job_logs.Segment]:
            if replica is not None:  # of the newest attempt (the rank's log may hold earlier ones)
                mine = job_logs.of_attempt(path, job.attempt) if path else None
                return job_logs.segments([mine], tail) if mine else []
            return job_logs.segments(job_logs.by_attempt([*earlier, *([path] if path else [])]), tail)

        try:
            parts = await to_thread.run_sync(read_parts)
        except BaseException:
            release()
            raise
        return _CountedStream(_as_text(_read_in_thread(parts)), release)

    if replica is not None:
        await to_thread.run_sync(newest)  # a replica the job does not have: the 422 before streaming
    release = _log_slot(request, caller.name)
    if release is None:
        return _too_many()

    async def stream() -> AsyncIterator[bytes]:
        pos, current, first = 0, None, True
        finder = job_logs.AttemptStartFinder()
        while True:
            job = await to_thread.run_sync(plane.get_job, caller, job_id)
            path = await to_thread.run_sync(newest)
            if first and replica is not None:  # one replica's: of the newest attempt only
                mine = await to_thread.run_sync(job_logs.of_attempt, path, job.attempt) if path else None
                now = [mine] if mine else []
            elif first:  # what the earlier attempts wrote on other nodes (Ray), then this one's log
                now = await to_thread.run_sync(job_logs.by_attempt, [*earlier, *([path] if path else [])])
            if first:
                # Followed from where the log stands now (the newest attempt is the last piece).
                pos = max((s.end for s in now if s.path == path), default=0)
                if tail is not None:  # the tail of it all as it is now, then what follows
                    parts = await to_thread.run_sync(job_logs.segments, now, tail)
                else:
                    parts = now
                async for chunk in _read_in_thread(parts):
                    yield chunk
                # A replica's newest attempt with no record in its log yet: looked for from the
                # next round on (below), never read from the log's start.
                current, first = (path if replica is None or now else None), False
            elif path != current:  # a new attempt writes elsewhere: from where it starts there
                start = await to_thread.run_sync(finder.find, Path(path), job.attempt) if path else 0
                if start is not None:  # else it has written nothing there yet
                    current, pos = path, start
            # Read after looking at the phase: a job that has ended has written all it will.
            while True:
                chunk, pos = await to_thread.run_sync(job_logs.read_from, current, pos)
                if chunk:
                    yield chunk
                if len(chunk) < job_logs.LOG_CHUNK:
                    break
            if job.phase.terminal or await request.is_disconnected():
                return
            await asyncio.sleep(FOLLOW_POLL_S)

    return _CountedStream(_until_deleted(job_id, stream()), release)
