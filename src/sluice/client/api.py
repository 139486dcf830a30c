"""`Client`: typed calls to a sluice server, for notebooks, scripts and the `sluice` CLI.

Every method returns a pydantic model (sluice.client.models) or an iterator of them, and
raises a `SluiceError` subclass (sluice.client.errors) carrying the server's own words. List
methods walk every page; `follow_*` methods stream until the job ends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from sluice.client.config import server_url, token_for
from sluice.client.errors import (
    BadRequestError,
    ProtocolError,
    SluiceError,
    UnreachableError,
    WaitTimeout,
    from_response,
)
from sluice.client.models import (
    DatasetOut,
    DeletedOut,
    EventOut,
    FaultOut,
    JobFilesOut,
    JobOut,
    JobsDeletedOut,
    NewTenantOut,
    NodeOut,
    PriorityClassOut,
    Progress,
    QueueOut,
    TenantOut,
    UsageOut,
    WarmResult,
)
from sluice.model import Phase
from sluice.settings import load_settings
from sluice.spec import (
    DatasetSpec,
    GrantSpec,
    JobSpec,
    PriorityClassSpec,
    QueuePatch,
    QueueSpec,
    SpecError,
    TenantPatch,
    TenantSpec,
    load_job_spec,
)
from sluice.spec.loading import load_dataset_spec, load_spec_file, parse_model

PAGE_SIZE = 500
"""Items asked per page when a list is walked (the API allows up to 1000)."""
DEFAULT_TIMEOUT_S = 30.0
LONG_TIMEOUT_S = 24 * 3600.0
"""For calls that do long work before answering (warming a dataset on every node)."""

M = TypeVar("M", bound=BaseModel)
S = TypeVar("S", bound=BaseModel)

SpecLike = BaseModel | Mapping[str, Any] | str | Path
"""A spec as a model, a mapping of its fields, or the path of a YAML/JSON file."""


def _spec(model: type[S], spec: Any, what: str) -> S:
    """`spec` validated here, so a bad field fails before any request, as a BadRequestError."""
    try:
        if isinstance(spec, model):
            return spec
        if isinstance(spec, str | Path):  # relative paths in a job's or dataset's file: from its folder
            if model is JobSpec:
                loaded: BaseModel = load_job_spec(spec)
            elif model is DatasetSpec:
                loaded = load_dataset_spec(spec)
            else:
                loaded = parse_model(model, load_spec_file(spec))
            assert isinstance(loaded, model)
            return loaded
        if isinstance(spec, Mapping):
            return parse_model(model, dict(spec))
    except SpecError as err:
        raise BadRequestError(f"invalid {what}: {err}", error=f"invalid {what}", problems=err.problems) from None
    raise TypeError(f"a {what} is a {model.__name__}, a mapping or a file path, not {type(spec).__name__}")


def _body(spec: BaseModel) -> dict[str, Any]:
    """The spec as a request body: only the fields that were given, as the user gave them.

    Defaults are the server's to fill in. Sending them would make them look set: a job's
    default `priority: 0` contradicts its `priority_class`, and keeps a default class away."""
    return spec.model_dump(mode="json", exclude_unset=True)


def _check_poll(poll_s: float) -> None:
    """A polling interval: a finite number of seconds above 0 (at most a day)."""
    if not (isinstance(poll_s, int | float) and math.isfinite(poll_s) and 0 < poll_s <= 86400):
        raise ValueError(f"poll_s: seconds between polls, above 0 and at most 86400, not {poll_s!r}")


class Client:
    """A connection to one sluice server as one tenant.

    `url` and `token` default to what the CLI uses: $SLUICE_URL / $SLUICE_TOKEN, else the
    files the server wrote in $SLUICE_HOME (server.json, token; admin.token first with
    `admin=True`). Use it as a context manager, or call `close()`.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        admin: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        settings = load_settings() if url is None or token is None else None
        self.url = (url or server_url(settings)).rstrip("/")
        token = token if token is not None else token_for(settings, admin=admin)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # ---------------------------------------------------------------- transport

    def _unreachable(self, err: Exception) -> UnreachableError:
        return UnreachableError(f"cannot reach the sluice server at {self.url} ({err})", detail=str(err))

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        json: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """One call; decoded JSON (text for text answers, None for none). For endpoints that
        have no typed method yet; raises the SluiceError the status implies."""
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        try:
            resp = self._http.request(method, path, params=params, json=json, **extra)
        except httpx.TransportError as err:
            raise self._unreachable(err) from None
        if resp.status_code >= 400:
            raise _error(resp)
        if resp.status_code == 204 or not resp.content:
            return None
        if resp.headers.get("content-type", "").startswith("application/json"):
            try:
                return resp.json()
            except ValueError:
                raise ProtocolError(f"the server at {self.url} answered {path} with broken JSON") from None
        return resp.text

    def pages(self, path: str, params: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None) -> Iterator[Any]:
        """Every item of a paginated list endpoint, following `next_cursor` to the last page."""
        base = list(params.items()) if isinstance(params, Mapping) else list(params or [])
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            query = [*base, ("limit", PAGE_SIZE), *([("cursor", cursor)] if cursor else [])]
            page = self.request("GET", path, params=query)
            if not isinstance(page, dict) or not isinstance(page.get("items"), list):
                raise ProtocolError(f"the server at {self.url} answered {path} with something that is not a list page")
            yield from page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return
            if cursor in seen:  # a server bug must not spin a client forever
                raise ProtocolError(f"the server at {self.url} repeated a page cursor for {path}")
            seen.add(cursor)

    def _one(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        return _parse(model, self.request(method, path, **kwargs), path)

    def _all(self, model: type[M], path: str, params: Any = None) -> list[M]:
        return [_parse(model, item, path) for item in self.pages(path, params)]

    def _stream(self, path: str, params: Mapping[str, Any], lines: bool) -> Iterator[str]:
        """A streamed text answer as it arrives (no read timeout): lines without their
        newline, or raw chunks (for a terminal, which should show partial lines too)."""
        try:
            with self._http.stream("GET", path, params=params, timeout=httpx.Timeout(30.0, read=None)) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise _error(resp)
                yield from resp.iter_lines() if lines else resp.iter_text()
        except httpx.TransportError as err:
            raise self._unreachable(err) from None

    # ---------------------------------------------------------------- jobs

    def submit(self, spec: SpecLike, *, resume_from: str | None = None) -> JobOut:
        """Submit a job: a JobSpec, a mapping of its fields, or a YAML/JSON spec file (whose
        folder is the default workdir). `resume_from`: start from that job's newest checkpoint
        (the call then waits for the server's copy of it, however long)."""
        job = _spec(JobSpec, spec, "job spec")
        if resume_from is not None:
            job = _spec(JobSpec, {**_body(job), "resume_from": resume_from}, "job spec")
        if job.resume_from is None:
            return self._one(JobOut, "POST", "/v1/jobs", json=_body(job))
        # The server copies the old job's checkpoints before it answers (up to
        # resume_max_copy_mb, 64 GiB by default): the usual timeout would give up on a big copy
        # the server still finishes, and a retry would then make a second job.
        return self._one(JobOut, "POST", "/v1/jobs", json=_body(job), timeout=LONG_TIMEOUT_S)

    def jobs(
        self,
        phase: Phase | str | Iterable[Phase | str] | None = None,
        *,
        tenant: str | None = None,
        queue: str | None = None,
        labels: Mapping[str, str] | None = None,
        array: str | None = None,
    ) -> list[JobOut]:
        """Your jobs (every tenant's for an admin), oldest first, all pages. The server
        filters by phase and `array` (the jobs of one job array, by its id: reading only
        those; NotFound for an array you have not); `tenant`, `queue` and `labels` (each
        given label with that value) are filtered here (the API has no such filter)."""
        phases = [phase] if isinstance(phase, Phase | str) else list(phase or [])
        params = [("phase", Phase(p).value if isinstance(p, Phase) else _phase(p)) for p in phases]
        if array is not None:
            params.append(("array", array))
        out = self._all(JobOut, "/v1/jobs", params)
        if tenant is not None:
            out = [j for j in out if j.tenant == tenant]
        if queue is not None:
            out = [j for j in out if j.spec.get("queue") == queue]
        if labels:
            want = dict(labels)
            out = [j for j in out if all((j.spec.get("labels") or {}).get(k) == v for k, v in want.items())]
        if array is not None:  # a server from before the filter ignores it
            out = [j for j in out if (j.spec.get("array") or {}).get("id") == array]
        return out

    def job(self, job_id: str) -> JobOut:
        return self._one(JobOut, "GET", f"/v1/jobs/{_seg(job_id, _JOB)}")

    def wait(self, job_id: str, timeout_s: float | None = None, poll_s: float = 1.0) -> JobOut:
        """Poll until the job is in a terminal phase (Succeeded, Failed, Cancelled) and return
        it; raises WaitTimeout (with `.job`) after `timeout_s` (None or inf: no limit). `poll_s` is
        above 0: a NaN timeout never fired and a poll of 0 asked the server in a tight loop."""
        if timeout_s is not None and math.isnan(timeout_s):
            raise ValueError("timeout_s: a number of seconds or None (no limit), not NaN")
        _check_poll(poll_s)
        deadline = None if timeout_s is None or math.isinf(timeout_s) else time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if Phase(job.phase).terminal:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {job_id} is still {job.phase} after {timeout_s:g}s", job)
            time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic())))

    def logs(
        self, job_id: str, tail: int | None = None, replica: int | None = None, *, all_replicas: bool = False
    ) -> str:
        """The job's output so far (its last 8 MiB), or its last `tail` lines; `replica`: only
        that replica's, on an engine that keeps a log per replica (Ray); `all_replicas`: every
        replica's, each line prefixed [rankK]."""
        params = _log_params(tail, replica, all_replicas)
        return str(self.request("GET", f"/v1/jobs/{_seg(job_id, _JOB)}/logs", params=params) or "")

    def follow_logs(
        self,
        job_id: str,
        tail: int | None = None,
        *,
        raw: bool = False,
        replica: int | None = None,
        all_replicas: bool = False,
    ) -> Iterator[str]:
        """The job's output as it writes it, until it ends: lines without their newline (raw:
        text chunks as they arrive); with `tail`, starting from its last `tail` lines;
        `replica` and `all_replicas` as for `logs`."""
        params: dict[str, Any] = {"follow": "true", **_log_params(tail, replica, all_replicas)}
        return self._stream(f"/v1/jobs/{_seg(job_id, _JOB)}/logs", params, lines=not raw)

    def progress(self, job_id: str) -> Progress | None:
        """The job's latest progress (step, loss, throughput, histories); None before its first report."""
        data = self.request("GET", f"/v1/jobs/{_seg(job_id, _JOB)}/progress")
        return _parse(Progress, data, "progress") if data else None

    def follow_progress(self, job_id: str, poll_s: float = 1.0) -> Iterator[Progress]:
        """Each new progress report (polled every `poll_s`) until the job ends; the last one
        seen is yielded once more only if it is new."""
        _check_poll(poll_s)
        last: float | None = None
        while True:
            job = self.job(job_id)
            p = self.progress(job_id)
            if p is not None and p.last_report != last:
                last = p.last_report
                yield p
            if Phase(job.phase).terminal:
                return
            time.sleep(poll_s)

    def cancel(self, job_id: str) -> JobOut:
        """Cancel: a queued job ends now, a running one checkpoints and exits."""
        return self._one(JobOut, "POST", f"/v1/jobs/{_seg(job_id, _JOB)}/cancel")

    def cancel_array(self, array_id: str) -> list[JobOut]:
        """Cancel every job of a job array that has not ended, in one request; the jobs
        cancelled (none when all had ended). NotFound for an array the caller has none of."""
        path = "/v1/jobs/cancel"
        answer = self.request("POST", path, json={"array": array_id})
        return [_parse(JobOut, item, path) for item in (answer or [])]

    def delete(self, job_id: str) -> JobsDeletedOut:
        """Forget an ended job now: its record, events and run folders (ConflictError while it
        has not ended, for one job of an array, or while a live job starts after it)."""
        return self._one(JobsDeletedOut, "DELETE", f"/v1/jobs/{_seg(job_id, _JOB)}")

    def delete_array(self, array_id: str) -> JobsDeletedOut:
        """Forget every job of a job array once all of them ended, in one request."""
        return self._one(JobsDeletedOut, "POST", "/v1/jobs/delete", json={"array": array_id})

    def files(self, job_id: str, path: str = "", *, replica: int | None = None) -> JobFilesOut:
        """One folder of the job's files (its `work/` HOME, `tmp/` and its checkpoints; `path`
        '' for the top), of replica `replica` of a gang (default rank 0)."""
        params: dict[str, Any] = {"path": path} | ({} if replica is None else {"replica": replica})
        return self._one(JobFilesOut, "GET", f"/v1/jobs/{_seg(job_id, _JOB)}/files", params=params)

    def download(self, job_id: str, path: str, out: BinaryIO, *, replica: int | None = None) -> int:
        """Write one of the job's files (e.g. `work/model.pt`) to `out`, as it arrives; the
        bytes written. A file the job is still writing comes up to the size it had when asked;
        one the job shrank meanwhile (the server ends early) is a SluiceError, whatever part of
        it was written to `out`."""
        params: dict[str, Any] = {"path": path} | ({} if replica is None else {"replica": replica})
        url = f"/v1/jobs/{_seg(job_id, _JOB)}/files/content"
        written = 0
        try:
            with self._http.stream("GET", url, params=params, timeout=httpx.Timeout(30.0, read=None)) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise _error(resp)
                for chunk in resp.iter_bytes():
                    out.write(chunk)
                    written += len(chunk)
                size = resp.headers.get("X-File-Size", "")
                if size.isdigit() and written < int(size):
                    raise SluiceError(
                        f"job {job_id}'s file {path!r} came short: {written} of {size} bytes (the job shrank or "
                        "rewrote it while it was sent); ask again once it is written"
                    )
        except httpx.TransportError as err:
            raise self._unreachable(err) from None
        return written

    def suspend(self, job_id: str) -> JobOut:
        """Suspend: the job checkpoints, stops and gives its quota back until resumed."""
        return self._one(JobOut, "POST", f"/v1/jobs/{_seg(job_id, _JOB)}/suspend")

    def resume(self, job_id: str) -> JobOut:
        """Resume a suspended job from its checkpoint."""
        return self._one(JobOut, "POST", f"/v1/jobs/{_seg(job_id, _JOB)}/resume")

    def why(self, job_id: str) -> list[EventOut]:
        """The job's history with reasons: phase changes, placement, CPU changes, restarts."""
        return self._all(EventOut, f"/v1/jobs/{_seg(job_id, _JOB)}/why")

    explain = why

    # ---------------------------------------------------------------- datasets

    def create_dataset(self, spec: SpecLike, *, probe: bool = True) -> DatasetOut:
        """Register a dataset; with `probe` its source is listed now (a wrong URL fails here)."""
        ds = _spec(DatasetSpec, spec, "dataset spec")
        return self._one(
            DatasetOut,
            "POST",
            "/v1/datasets",
            json=_body(ds),
            params={"probe": str(probe).lower()},
            timeout=600,
        )

    def datasets(self) -> list[DatasetOut]:
        """Your datasets and the published ones (every tenant's for an admin)."""
        return self._all(DatasetOut, "/v1/datasets")

    def dataset(self, name: str, tenant: str | None = None) -> DatasetOut:
        return self._one(DatasetOut, "GET", f"/v1/datasets/{_seg(name, _DATASET)}", params=_owner(tenant))

    def delete_dataset(self, name: str, tenant: str | None = None) -> DeletedOut:
        """Delete a dataset and drop it from every node's cache (its source is not touched)."""
        return self._one(DeletedOut, "DELETE", f"/v1/datasets/{_seg(name, _DATASET)}", params=_owner(tenant))

    def warm_dataset(self, name: str, nodes: Iterable[str] = (), tenant: str | None = None) -> WarmResult:
        """Fetch the dataset into every node's cache (or `nodes`'); returns when all are done."""
        params = {"node": list(nodes), **_owner(tenant)}
        return self._one(
            WarmResult, "POST", f"/v1/datasets/{_seg(name, _DATASET)}/warm", params=params, timeout=LONG_TIMEOUT_S
        )

    def publish_dataset(
        self, name: str, tenant: str | None = None, published: bool = True, with_credentials: bool = False
    ) -> DatasetOut:
        """Admin: make a dataset readable by every tenant (or withdraw it, published=False).
        `with_credentials`: publish it although its storage options hold credentials, which
        every tenant's jobs that mount it then get (else a 409)."""
        method = "POST" if published else "DELETE"
        params = _owner(tenant)
        if with_credentials and published:
            params["with_credentials"] = "true"
        return self._one(DatasetOut, method, f"/v1/datasets/{_seg(name, _DATASET)}/publish", params=params or None)

    # ---------------------------------------------------------------- tenants (admin)

    def create_tenant(self, spec: TenantSpec | Mapping[str, Any], *, force: bool = False) -> NewTenantOut:
        """Create a tenant; the answer carries its token, shown only this once."""
        t = _spec(TenantSpec, spec, "tenant")
        params = {"force": "true"} if force else None
        return self._one(NewTenantOut, "POST", "/v1/tenants", json=_body(t), params=params)

    def tenants(self) -> list[TenantOut]:
        return self._all(TenantOut, "/v1/tenants")

    def update_tenant(self, name: str, patch: TenantPatch | Mapping[str, Any]) -> TenantOut:
        """Change a tenant's weight, job limit (0 removes it) or priority cap (max_priority None
        removes it) live: only the fields given change."""
        p = _spec(TenantPatch, patch, "tenant change")
        return self._one(
            TenantOut, "PATCH", f"/v1/tenants/{_seg(name, _TENANT)}", json=p.model_dump(mode="json", exclude_unset=True)
        )

    def delete_tenant(self, name: str) -> None:
        """Delete a tenant (it must have no unfinished jobs); its token stops working."""
        self.request("DELETE", f"/v1/tenants/{_seg(name, _TENANT)}")

    # ---------------------------------------------------------------- queues

    def queues(self) -> list[QueueOut]:
        """Every queue (admin) or those granted to you, with usage and backlog."""
        return self._all(QueueOut, "/v1/queues")

    def create_queue(self, spec: QueueSpec | Mapping[str, Any]) -> QueueOut:
        q = _spec(QueueSpec, spec, "queue")
        return self._one(QueueOut, "POST", "/v1/queues", json=_body(q))

    def update_queue(self, name: str, patch: QueuePatch | Mapping[str, Any]) -> QueueOut:
        """Change a queue live: only the fields given change (max_runtime_s None removes it)."""
        p = _spec(QueuePatch, patch, "queue change")
        return self._one(
            QueueOut, "PATCH", f"/v1/queues/{_seg(name, _QUEUE)}", json=p.model_dump(mode="json", exclude_unset=True)
        )

    def grant_queue(self, name: str, tenant: str, granted: bool = True) -> QueueOut:
        g = _spec(GrantSpec, {"tenant": tenant, "granted": granted}, "grant")
        return self._one(QueueOut, "POST", f"/v1/queues/{_seg(name, _QUEUE)}/grants", json=_body(g))

    def delete_queue(self, name: str) -> None:
        self.request("DELETE", f"/v1/queues/{_seg(name, _QUEUE)}")

    # ---------------------------------------------------------------- priority classes

    def usage(self, since: float | None = None, tenant: str | None = None, all_tenants: bool = False) -> list[UsageOut]:
        """Per tenant, what its jobs submitted at or after `since` (Unix seconds; None: all)
        held and ran: your own, or an admin's pick of every tenant (`tenant`: one). With
        `all_tenants` a tenant's token is a ForbiddenError, not its own rows alone."""
        params: list[tuple[str, object]] = [(k, v) for k, v in (("since", since), ("tenant", tenant)) if v is not None]
        if all_tenants:
            params.append(("all", "true"))
        answer = self.request("GET", "/v1/usage", params=params)
        return [_parse(UsageOut, item, "/v1/usage") for item in answer]

    def priority_classes(self) -> list[PriorityClassOut]:
        """Every named priority class (readable by every tenant: jobs name them)."""
        answer = self.request("GET", "/v1/priority-classes")
        return [_parse(PriorityClassOut, item, "/v1/priority-classes") for item in answer["items"]]

    def create_priority_class(self, spec: PriorityClassSpec | Mapping[str, Any]) -> PriorityClassOut:
        """Admin: a class jobs may name with `priority_class`."""
        p = _spec(PriorityClassSpec, spec, "priority class")
        return self._one(PriorityClassOut, "POST", "/v1/priority-classes", json=_body(p))

    def delete_priority_class(self, name: str) -> None:
        """Admin: refused (ConflictError) while an unfinished job uses it."""
        self.request("DELETE", f"/v1/priority-classes/{_seg(name, _CLASS)}")

    # ---------------------------------------------------------------- nodes

    def nodes(self) -> list[NodeOut]:
        return self._all(NodeOut, "/v1/nodes")

    def cordon(self, node: str, reason: str) -> NodeOut:
        """Admin: place nothing new on the node and move its jobs off through checkpoints."""
        return self._one(NodeOut, "POST", f"/v1/nodes/{_seg(node, _NODE)}/cordon", json={"reason": reason})

    def uncordon(self, node: str) -> NodeOut:
        return self._one(NodeOut, "POST", f"/v1/nodes/{_seg(node, _NODE)}/uncordon")

    def inject_fault(
        self, node: str, kind: str, seconds: float = 60.0, workers: int | None = None, memory_mb: int | None = None
    ) -> FaultOut:
        """Admin: make the node sick on purpose for a while (cpu, memory, io or net). `workers`
        is for cpu/io/net faults, `memory_mb` (default 512) for memory faults only."""
        body: dict[str, Any] = {"kind": kind, "seconds": seconds}
        if workers is not None:
            body["workers"] = workers
        if memory_mb is not None:
            body["memory_mb"] = memory_mb
        return self._one(FaultOut, "POST", f"/v1/nodes/{_seg(node, _NODE)}/faults", json=body)

    def node_why(self, node: str) -> dict[str, Any]:
        """The node's health, reason and the KPIs behind its newest alarm (GET .../why)."""
        out = self.request("GET", f"/v1/nodes/{_seg(node, _NODE)}/why")
        return out if isinstance(out, dict) else {}

    def stop_faults(self, node: str) -> FaultOut:
        return self._one(FaultOut, "DELETE", f"/v1/nodes/{_seg(node, _NODE)}/faults")


_JOB, _DATASET, _TENANT, _QUEUE, _CLASS, _NODE = (
    "job id",
    "dataset name",
    "tenant name",
    "queue name",
    "priority class name",
    "node name",
)
"""What each path segment is called in a refusal."""


def _seg(value: str, what: str) -> str:
    """`value` as one URL path segment: percent-encoded, so `?`, `#`, `%` or `..` in an id
    cannot retarget the request. An empty value, or one with a `/` (servers decode `%2F`
    before routing), is refused here as a BadRequestError naming it."""
    if not isinstance(value, str) or not value:
        raise BadRequestError(f"{what} may not be empty", error="invalid request")
    if "/" in value:
        raise BadRequestError(f"{what} {value!r} may not contain '/'", error="invalid request")
    if value.strip(".") == "":  # '.' and '..' are dot segments a URL library would resolve
        return "%2E" * len(value)
    return quote(value, safe="")


def _owner(tenant: str | None) -> dict[str, str]:
    return {"tenant": tenant} if tenant else {}


def _phase(name: str) -> str:
    """A phase name in any case, as the server spells it."""
    for p in Phase:
        if p.value.lower() == name.lower():
            return p.value
    raise BadRequestError(
        f"phase: unknown phase {name!r}; one of {', '.join(p.value for p in Phase)}", error="invalid request"
    )


def _parse(model: type[M], data: Any, what: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ProtocolError(f"the server's answer to {what} is not a {model.__name__}: {err}") from None


def _error(resp: httpx.Response) -> SluiceError:
    try:
        body: Any = resp.json()
    except ValueError:
        body = {"detail": resp.text.strip() or resp.reason_phrase}
    return from_response(resp.status_code, body, resp.reason_phrase)


def _log_params(tail: int | None, replica: int | None, all_replicas: bool) -> dict[str, Any]:
    params: dict[str, Any] = {k: v for k, v in (("tail", tail), ("replica", replica)) if v is not None}
    if all_replicas:
        params["all_replicas"] = "true"
    return params
