"""/v1/datasets: register, list, inspect, warm, publish and delete datasets (per tenant).

A tenant sees its own datasets and those an admin published; caches are per tenant (a
dataset's cache key is `owner/name`). An admin names another tenant's dataset with `?tenant=`.
Storage options can hold credentials, so only their names are ever returned; a password in
the source URL is shown as `***`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel

from sluice.api.auth import CallerDep, PlaneDep
from sluice.api.pagination import DEFAULT_LIMIT, CursorQ, LimitQ, Page, decode_cursor, page_of
from sluice.api.schemas import DatasetOut, DeletedOut
from sluice.control.datasets import DatasetService
from sluice.control.plane import ControlPlane
from sluice.data.cache import cache_key
from sluice.data.warm import WarmReport
from sluice.spec import DatasetSpec
from sluice.spec.dataset import shown_source

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


def dataset_out(
    rec: Any,
    cached: dict[str, float] | None = None,
    cached_on: dict[str, dict[str, float]] | None = None,
    published: dict[str, str] | None = None,
    counts: dict[str, int] | None = None,
) -> DatasetOut:
    """The record as the API shows it, with how much of it each node caches (`cached_on`:
    `DatasetService.cached_on`, the copy the caller's jobs read) and, given
    `counts` (see `_counts`), its cache hits and misses."""
    key = cache_key(rec.tenant, rec.name)
    hits = None if counts is None else {t: counts[f"hits_{t}"] for t in ("memory", "disk")}
    misses = None if counts is None else counts["misses"]
    total = 0 if hits is None or misses is None else sum(hits.values()) + misses
    return DatasetOut(
        tenant=rec.tenant,
        name=rec.name,
        source=shown_source(rec.spec.source),
        format=rec.spec.format,
        cache=rec.spec.cache,
        storage_option_names=sorted(rec.spec.storage_options),
        created_at=rec.created_at,
        items=rec.items,
        total_bytes=rec.total_bytes,
        cached_fraction=None if cached is None else cached.get(key, 0.0),
        cached_on=(cached_on or {}).get(key, {}),
        published=(published or {}).get(rec.name) == rec.tenant,
        cache_hits=hits,
        cache_misses=misses,
        hit_rate=sum(hits.values()) / total if hits is not None and total else None,
    )


def _counts(request: Request, caller: Any, rec: Any) -> dict[str, int] | None:
    """The dataset's cache counters, for its owner or an admin only (None for anyone else):
    a published dataset's counters include other tenants' reads."""
    if not (caller.admin or caller.name == rec.tenant):
        return None
    counts: dict[str, int] = request.app.state.metrics.cache_counts(cache_key(rec.tenant, rec.name))
    return counts


def service(request: Request, plane: ControlPlane) -> DatasetService:
    return plane.datasets


def _cached(svc: DatasetService, caller: Any, records: list[Any]) -> dict[str, float] | None:
    """How much of each dataset this host's node cache holds for the caller's jobs."""
    return svc.cached_here(caller, records)


def _by_node(plane: ControlPlane, svc: DatasetService, caller: Any, records: list[Any]) -> dict[str, dict[str, float]]:
    """Per dataset, how much of it each node holds in the copy the caller's jobs read (under
    isolation its own uid's), from the nodes' agents' reports."""
    return svc.cached_on(caller, records, plane.cached_by_node())


@router.get("", response_model=Page[DatasetOut])
def list_datasets(
    request: Request, plane: PlaneDep, caller: CallerDep, limit: LimitQ = DEFAULT_LIMIT, cursor: CursorQ = None
) -> Page[DatasetOut]:
    """The caller's datasets (every tenant's for an admin), by tenant and name, a page at a time."""
    after = decode_cursor("datasets", cursor, (str, str))
    svc = service(request, plane)
    records = svc.list_datasets(caller, after=after, limit=limit + 1)
    page, nxt = page_of(records, limit, "datasets", lambda r: (r.tenant, r.name))
    cached, by_node, pub = _cached(svc, caller, page), _by_node(plane, svc, caller, page), svc.published()
    items = [dataset_out(r, cached, by_node, pub, _counts(request, caller, r)) for r in page]
    return Page[DatasetOut](items=items, next_cursor=nxt)


@router.post("", status_code=201, response_model=DatasetOut)
def create_dataset(
    request: Request, plane: PlaneDep, caller: CallerDep, spec: DatasetSpec, probe: bool = True
) -> DatasetOut:
    """Register a dataset. With probe (default) its source is listed now: a wrong URL is a 422."""
    return dataset_out(service(request, plane).create(caller, spec, probe=probe))


Owner = Query(default=None, description="The owning tenant (admin: any; others: their own or a publisher).")


@router.get("/{name}", response_model=DatasetOut)
def get_dataset(
    request: Request, plane: PlaneDep, caller: CallerDep, name: str, tenant: str | None = Owner
) -> DatasetOut:
    """One dataset the caller may read: its own, else a published one of that name."""
    svc = service(request, plane)
    rec = svc.get(caller, name, tenant)
    return dataset_out(
        rec,
        _cached(svc, caller, [rec]),
        _by_node(plane, svc, caller, [rec]),
        svc.published(),
        _counts(request, caller, rec),
    )


@router.delete("/{name}", response_model=DeletedOut)
def delete_dataset(
    request: Request, plane: PlaneDep, caller: CallerDep, name: str, tenant: str | None = Owner
) -> DeletedOut:
    """Delete the caller's dataset (an admin: any tenant's) and drop its own cache entry from
    every node. A published dataset of another tenant is a 403: readable, not deletable."""
    return DeletedOut(name=name, nodes=service(request, plane).delete(caller, name, tenant))


@router.post("/{name}/publish", response_model=DatasetOut)
def publish_dataset(
    request: Request,
    plane: PlaneDep,
    caller: CallerDep,
    name: str,
    tenant: str | None = Owner,
    with_credentials: bool = Query(
        default=False,
        description="Publish it although it holds credentials (storage options key, secret, token, or a "
        "password in its source URL): every tenant's job that mounts it gets them. Without this, such a "
        "dataset is a 409.",
    ),
) -> DatasetOut:
    """Admin only: make the dataset readable and mountable by every tenant (not deletable by
    them). A second published dataset of the same name is a 409, and so is one whose storage
    options hold credentials, unless `with_credentials`."""
    svc = service(request, plane)
    return dataset_out(svc.publish(caller, name, tenant, with_credentials=with_credentials), published=svc.published())


@router.delete("/{name}/publish", response_model=DatasetOut)
def withdraw_dataset(
    request: Request, plane: PlaneDep, caller: CallerDep, name: str, tenant: str | None = Owner
) -> DatasetOut:
    """Admin only: withdraw a published dataset; it is its owner's alone again."""
    svc = service(request, plane)
    return dataset_out(svc.publish(caller, name, tenant, published=False), published=svc.published())


class WarmOut(BaseModel):
    name: str
    nodes: list[WarmReport]


@router.post("/{name}/warm", response_model=WarmOut)
def warm_dataset(
    request: Request,
    plane: PlaneDep,
    caller: CallerDep,
    name: str,
    node: list[str] = Query(default=[], description="Warm only these nodes (repeatable); default every node."),
    tenant: str | None = Owner,
) -> WarmOut:
    """Fetch the whole dataset into the cache of every node (or the named ones) through each
    node's agent; returns when all are done, with what each fetched and how long it took. A
    node that failed has its error in its entry; an unknown node name is a 422."""
    reports = service(request, plane).warm(caller, name, nodes=node or None, tenant=tenant)
    return WarmOut(name=name, nodes=reports)
