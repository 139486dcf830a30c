"""MemoryStore: the Store protocol in plain dicts (simulator and unit tests)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from sluice.model import JobRecord, Phase
from sluice.store.base import DatasetRecord, DuplicateError, EventRecord, NodeRecord, TenantRecord


class MemoryStore:
    def __init__(self, keep_events: bool = True) -> None:
        self.keep_events = keep_events
        self._jobs: dict[str, JobRecord] = {}
        self._events: list[EventRecord] = []
        self._tenants: dict[str, TenantRecord] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._datasets: dict[tuple[str, str], DatasetRecord] = {}

    def create_job(self, job: JobRecord) -> None:
        if job.id in self._jobs:
            raise DuplicateError(f"job {job.id} exists")
        self._jobs[job.id] = copy.copy(job)

    def save_job(self, job: JobRecord) -> None:
        self._jobs[job.id] = copy.copy(job)

    def get_job(self, job_id: str) -> JobRecord | None:
        j = self._jobs.get(job_id)
        return copy.copy(j) if j else None

    def list_jobs(
        self, tenant: str | None = None, phases: Iterable[Phase] | None = None, limit: int | None = None
    ) -> list[JobRecord]:
        ph = set(phases) if phases is not None else None
        out = [
            copy.copy(j)
            for j in self._jobs.values()
            if (tenant is None or j.tenant == tenant) and (ph is None or j.phase in ph)
        ]
        out.sort(key=lambda j: (j.submitted_at, j.id))
        return out[:limit] if limit else out

    def append_event(
        self,
        time: float,
        kind: str,
        message: str,
        job_id: str | None = None,
        node: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        if self.keep_events:
            self._events.append(EventRecord(len(self._events) + 1, time, kind, message, job_id, node, data or {}))

    def events(
        self,
        job_id: str | None = None,
        node: str | None = None,
        kinds: Iterable[str] | None = None,
        since_seq: int = 0,
    ) -> list[EventRecord]:
        ks = set(kinds) if kinds is not None else None
        return [
            e
            for e in self._events
            if e.seq > since_seq
            and (job_id is None or e.job_id == job_id)
            and (node is None or e.node == node)
            and (ks is None or e.kind in ks)
        ]

    def create_tenant(self, tenant: TenantRecord) -> None:
        if tenant.name in self._tenants:
            raise DuplicateError(f"tenant {tenant.name} exists")
        self._tenants[tenant.name] = copy.copy(tenant)

    def save_tenant(self, tenant: TenantRecord) -> None:
        self._tenants[tenant.name] = copy.copy(tenant)

    def get_tenant(self, name: str) -> TenantRecord | None:
        return self._tenants.get(name)

    def tenant_by_token_hash(self, token_hash: str) -> TenantRecord | None:
        return next((t for t in self._tenants.values() if t.token_hash == token_hash), None)

    def list_tenants(self) -> list[TenantRecord]:
        return sorted(self._tenants.values(), key=lambda t: t.name)

    def delete_tenant(self, name: str) -> None:
        self._tenants.pop(name, None)

    def save_node(self, node: NodeRecord) -> None:
        self._nodes[node.name] = copy.copy(node)

    def list_nodes(self) -> list[NodeRecord]:
        return sorted(self._nodes.values(), key=lambda n: n.name)

    def create_dataset(self, ds: DatasetRecord) -> None:
        if (ds.tenant, ds.name) in self._datasets:
            raise DuplicateError(f"dataset {ds.tenant}/{ds.name} exists")
        self._datasets[(ds.tenant, ds.name)] = copy.copy(ds)

    def save_dataset(self, ds: DatasetRecord) -> None:
        self._datasets[(ds.tenant, ds.name)] = copy.copy(ds)

    def get_dataset(self, tenant: str, name: str) -> DatasetRecord | None:
        d = self._datasets.get((tenant, name))
        return copy.copy(d) if d else None

    def list_datasets(self, tenant: str | None = None) -> list[DatasetRecord]:
        return [copy.copy(d) for k, d in sorted(self._datasets.items()) if tenant is None or k[0] == tenant]

    def delete_dataset(self, tenant: str, name: str) -> None:
        self._datasets.pop((tenant, name), None)

    def close(self) -> None:
        pass
