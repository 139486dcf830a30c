"""The dataset registry: tenants declare datasets, jobs mount them by name.

Visibility is per tenant: a tenant sees and mounts its own datasets; an admin sees all. A
dataset that is not the caller's is reported as not found (never "forbidden"), so names of
other tenants' datasets do not leak. Registering lists the source once, so a typo in a URL is
a clear 422 at `create` time rather than a job that dies on its first batch.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Protocol

from sluice.control.errors import Conflict, Forbidden, NotFound
from sluice.data.cache import NodeCache
from sluice.data.errors import DataError
from sluice.data.settings import CacheSettings
from sluice.data.source import Source
from sluice.data.warm import WarmReport, warm_node
from sluice.engine.base import CacheWarmer
from sluice.spec import DatasetSpec, SpecError
from sluice.spec.errors import FieldProblem
from sluice.store.base import DatasetRecord, DuplicateError, Store


class Caller(Protocol):
    name: str
    admin: bool


class DatasetService:
    def __init__(self, store: Store, cache_settings: CacheSettings | None = None, engine: object | None = None) -> None:
        self.store = store
        self.cache_settings = cache_settings or CacheSettings()
        self.warmer = engine if isinstance(engine, CacheWarmer) else None
        """The engine, when its nodes' agents can warm their caches (local, Ray)."""

    def _owner(self, caller: Caller, tenant: str | None) -> str:
        owner = tenant or caller.name
        if owner != caller.name and not caller.admin:
            raise Forbidden(f"tenant {caller.name!r} may not manage datasets of tenant {owner!r}")
        return owner

    def create(self, caller: Caller, spec: DatasetSpec, probe: bool = True) -> DatasetRecord:
        """Register a dataset; with `probe`, list its source to check it and learn its size."""
        owner = self._owner(caller, spec.tenant)
        if self.store.get_dataset(owner, spec.name) is not None:
            raise Conflict(f"dataset {spec.name!r} exists for tenant {owner!r}; delete it first")
        rec = DatasetRecord(owner, spec.name, spec.model_copy(update={"tenant": owner}), created_at=time.time())
        if probe:
            try:
                manifest = Source(spec.source, spec.storage_options, retries=1, backoff_s=0.1).list()
            except (DataError, OSError, ValueError) as err:
                raise SpecError([FieldProblem("source", f"cannot list {spec.source}: {err}")]) from None
            if len(manifest) == 0:
                raise SpecError([FieldProblem("source", f"{spec.source} holds no files")])
            rec.items, rec.total_bytes = len(manifest), manifest.total_bytes
        try:
            self.store.create_dataset(rec)
        except DuplicateError:
            raise Conflict(f"dataset {spec.name!r} exists for tenant {owner!r}") from None
        return rec

    def list_datasets(self, caller: Caller) -> list[DatasetRecord]:
        return self.store.list_datasets(None if caller.admin else caller.name)

    def get(self, caller: Caller, name: str, tenant: str | None = None) -> DatasetRecord:
        owner = tenant or caller.name
        rec = self.store.get_dataset(owner, name)
        if rec is None or (owner != caller.name and not caller.admin):
            raise NotFound(f"no dataset {name!r}")
        return rec

    def delete(self, caller: Caller, name: str, tenant: str | None = None, purge_cache: bool = True) -> dict[str, str]:
        """Unregister the dataset and, with `purge_cache`, drop it from every node's cache
        (through each node's agent); per node, what the purge did."""
        rec = self.get(caller, name, tenant)
        self.store.delete_dataset(rec.tenant, rec.name)
        if not purge_cache:
            return {}
        if self.warmer is not None:
            return self.warmer.drop_dataset(rec.name)
        removed = self.node_cache().remove(rec.name)
        return {socket.gethostname(): "removed" if removed else "not cached"}

    def node_cache(self) -> NodeCache:
        return NodeCache(self.cache_settings)

    def warm(self, caller: Caller, name: str, nodes: list[str] | None = None, workers: int = 16) -> list[WarmReport]:
        """Fetch the whole dataset into the cache of every node (or `nodes`), through each
        node's agent; one report per node. An engine without node agents (the simulator, a
        test's fake) warms the control plane's own node instead."""
        rec = self.get(caller, name)
        src, opts = rec.spec.source, dict(rec.spec.storage_options)
        if self.warmer is not None:
            try:
                return self.warmer.warm_dataset(rec.name, src, opts, nodes or None, workers)
            except ValueError as err:
                raise SpecError([FieldProblem("nodes", str(err))]) from None
        if nodes:
            raise SpecError(
                [FieldProblem("nodes", "this engine has no node agents to warm; warm without naming nodes")]
            )
        return [warm_node(self.node_cache(), socket.gethostname(), rec.name, src, opts, workers)]

    # -- what the controller gives jobs and policies ----------------------------------------
    def launch_env(self, tenant: str, names: list[str]) -> dict[str, str]:
        """Environment for a job mounting `names`: where each dataset lives and where the node
        cache is. The controller merges it into LaunchRequest.env."""
        table: dict[str, Any] = {}
        for n in names:
            rec = self.store.get_dataset(tenant, n)
            if rec is not None:
                table[n] = {"source": rec.spec.source, "storage_options": dict(rec.spec.storage_options)}
        s = self.cache_settings
        return {
            "SLUICE_DATASETS": json.dumps(table, sort_keys=True),
            "SLUICE_CACHE_DISK_DIR": str(s.resolved_disk_dir()),
            "SLUICE_CACHE_MEMORY_DIR": str(s.resolved_memory_dir()),
        }

    def dataset_bytes(self, tenant: str, names: list[str]) -> dict[str, int]:
        """Sizes for JobView.dataset_bytes (what data-aware placement weighs)."""
        out: dict[str, int] = {}
        for n in names:
            rec = self.store.get_dataset(tenant, n)
            if rec is not None and rec.total_bytes is not None:
                out[n] = rec.total_bytes
        return out

    def missing(self, tenant: str, names: list[str]) -> list[str]:
        """Datasets a job mounts that its tenant has not registered (a job spec check)."""
        return [n for n in names if self.store.get_dataset(tenant, n) is None]
