"""/v1/datasets: register, list, inspect and delete datasets (per-tenant visibility).

Storage options can hold credentials, so only their names are ever returned.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel

from sluice.api.auth import CallerDep, PlaneDep
from sluice.control.datasets import DatasetService
from sluice.control.errors import NotFound
from sluice.data.warm import WarmReport
from sluice.spec import DatasetSpec

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


class DatasetOut(BaseModel):
    tenant: str
    name: str
    source: str
    format: str
    cache: bool
    storage_option_names: list[str]
    created_at: float
    items: int | None
    total_bytes: int | None
    cached_fraction: float | None = None
    """Share of the dataset's bytes held by this node's cache (the control plane's node)."""
    cached_on: dict[str, float] = {}
    """Per node of the cluster (as its agent last reported, every few seconds): share of the
    dataset's bytes in that node's cache; nodes holding none are left out."""

    @staticmethod
    def of(
        rec: Any, cached: dict[str, float] | None = None, by_node: dict[str, dict[str, float]] | None = None
    ) -> DatasetOut:
        return DatasetOut(
            tenant=rec.tenant,
            name=rec.name,
            source=rec.spec.source,
            format=rec.spec.format,
            cache=rec.spec.cache,
            storage_option_names=sorted(rec.spec.storage_options),
            created_at=rec.created_at,
            items=rec.items,
            total_bytes=rec.total_bytes,
            cached_fraction=None if cached is None else cached.get(rec.name, 0.0),
            cached_on={n: d[rec.name] for n, d in sorted((by_node or {}).items()) if d.get(rec.name, 0.0) > 0},
        )


def service(request: Request, plane: Any) -> DatasetService:
    svc: DatasetService | None = getattr(plane, "datasets", None) or getattr(request.app.state, "datasets", None)
    if svc is None:
        store = getattr(plane, "store", None)
        if store is None:
            raise NotFound("this control plane has no dataset registry")
        svc = DatasetService(store)
        request.app.state.datasets = svc
    return svc


def _cached(svc: DatasetService) -> dict[str, float] | None:
    try:
        return svc.node_cache().state()[0]
    except OSError:
        return None


def _by_node(plane: Any) -> dict[str, dict[str, float]]:
    """Every node's cache as its agent reported it (empty for a plane that does not know)."""
    report = getattr(plane, "cached_by_node", None)
    return report() if callable(report) else {}


@router.get("", response_model=list[DatasetOut])
def list_datasets(request: Request, plane: PlaneDep, caller: CallerDep) -> list[DatasetOut]:
    svc = service(request, plane)
    cached, by_node = _cached(svc), _by_node(plane)
    return [DatasetOut.of(r, cached, by_node) for r in svc.list_datasets(caller)]


@router.post("", status_code=201, response_model=DatasetOut)
def create_dataset(
    request: Request, plane: PlaneDep, caller: CallerDep, spec: DatasetSpec, probe: bool = True
) -> DatasetOut:
    """Register a dataset. With probe (default) its source is listed now: a wrong URL is a 422."""
    return DatasetOut.of(service(request, plane).create(caller, spec, probe=probe))


@router.get("/{name}", response_model=DatasetOut)
def get_dataset(request: Request, plane: PlaneDep, caller: CallerDep, name: str) -> DatasetOut:
    svc = service(request, plane)
    return DatasetOut.of(svc.get(caller, name), _cached(svc), _by_node(plane))


class DeletedOut(BaseModel):
    name: str
    nodes: dict[str, str]
    """Per node, what dropping the dataset from its cache did ("removed", "not cached", or an error)."""


@router.delete("/{name}", response_model=DeletedOut)
def delete_dataset(request: Request, plane: PlaneDep, caller: CallerDep, name: str) -> DeletedOut:
    return DeletedOut(name=name, nodes=service(request, plane).delete(caller, name))


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
) -> WarmOut:
    """Fetch the whole dataset into the cache of every node (or the named ones) through each
    node's agent; returns when all are done, with what each fetched and how long it took. A
    node that failed has its error in its entry; an unknown node name is a 422."""
    reports = service(request, plane).warm(caller, name, nodes=node or None)
    return WarmOut(name=name, nodes=reports)
