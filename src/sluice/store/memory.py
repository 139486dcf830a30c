"""MemoryStore: the Store protocol in plain dicts (simulator and unit tests)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

from sluice.model import JobRecord, Phase
from sluice.model.queue import PriorityClass
from sluice.store.base import (
    DatasetRecord,
    DuplicateError,
    EventRecord,
    HeldTime,
    NewEvent,
    NodeRecord,
    QueueRecord,
    TenantRecord,
    UsageRow,
    hour_of,
)


class MemoryStore:
    def __init__(self, keep_events: bool = True) -> None:
        self.keep_events = keep_events
        self._jobs: dict[str, JobRecord] = {}
        self._events: list[EventRecord] = []
        self._last_seq = 0  # a deleted event's seq is never given out again
        self._tenants: dict[str, TenantRecord] = {}
        self._deleted_tenants: dict[str, float] = {}
        self._uids: dict[str, int] = {}
        self._uids_taken: set[int] = set()
        self._nodes: dict[str, NodeRecord] = {}
        self._datasets: dict[tuple[str, str], DatasetRecord] = {}
        self._published: dict[str, str] = {}
        self._queues: dict[str, QueueRecord] = {}
        self._priority_classes: dict[str, PriorityClass] = {}
        self._held: dict[tuple[str, float, bool], tuple[float, float, float]] = {}
        self._grants: set[tuple[str, str]] = set()

    def create_job(self, job: JobRecord, events: Sequence[NewEvent] = ()) -> None:
        if job.id in self._jobs:
            raise DuplicateError(f"job {job.id} exists")
        self._jobs[job.id] = job
        self._append(events)

    def create_jobs(self, jobs: Sequence[tuple[JobRecord, Sequence[NewEvent]]]) -> None:
        ids = [job.id for job, _ in jobs]
        taken = [i for i in ids if i in self._jobs]
        if taken or len(set(ids)) != len(ids):
            raise DuplicateError(f"job {(taken or ids)[0]} exists")
        for job, events in jobs:
            self._jobs[job.id] = job
            self._append(events)

    def save_job(self, job: JobRecord, events: Sequence[NewEvent] = ()) -> None:
        self._jobs[job.id] = job  # records are immutable: no copy needed
        self._append(events)

    def _append(self, events: Sequence[NewEvent]) -> None:
        for e in events:
            self.append_event(e.time, e.kind, e.message, e.job_id, e.node, e.data)

    def get_job(self, job_id: str) -> JobRecord | None:
        return self._jobs.get(job_id)

    def list_jobs(
        self,
        tenant: str | None = None,
        phases: Iterable[Phase] | None = None,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[JobRecord]:
        ph = set(phases) if phases is not None else None
        out = [
            j
            for j in self._jobs.values()
            if (tenant is None or j.tenant == tenant)
            and (ph is None or j.phase in ph)
            and (after is None or (j.submitted_at, j.id) > after)
        ]
        out.sort(key=lambda j: (j.submitted_at, j.id))
        return out[:limit] if limit else out

    def job_phases(self, job_ids: Sequence[str]) -> dict[str, Phase]:
        return {i: self._jobs[i].phase for i in job_ids if i in self._jobs}

    def count_jobs(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for j in self._jobs.values():
            out[j.phase.value] = out.get(j.phase.value, 0) + 1
        return out

    def job_usage(self, tenant: str | None = None, since: float | None = None) -> list[UsageRow]:
        sums: dict[tuple[str, str, bool], tuple[int, float, float, int]] = {}
        for j in self._jobs.values():
            if (tenant is not None and j.tenant != tenant) or (since is not None and j.submitted_at < since):
                continue
            key = (j.tenant, j.phase.value, j.spec.resources.gpus > 0)
            n, service, run, restarts = sums.get(key, (0, 0.0, 0.0, 0))
            sums[key] = (n + 1, service + j.attained_service, run + j.run_s, restarts + j.restarts)
        return [UsageRow(t, p, g, *v) for (t, p, g), v in sorted(sums.items())]

    def ended_before(self, before: float, limit: int, after: tuple[float, str] | None = None) -> list[JobRecord]:
        ended = [
            j
            for j in self._jobs.values()
            if j.phase.terminal
            and j.finished_at is not None
            and j.finished_at < before
            and (after is None or (j.finished_at, j.id) > after)
        ]
        ended.sort(key=lambda j: (j.finished_at or 0.0, j.id))
        return ended[:limit]

    def delete_jobs(self, job_ids: Sequence[str]) -> int:
        gone = {i for i in job_ids if self._jobs.pop(i, None) is not None}
        if gone:
            self._events = [e for e in self._events if e.job_id not in gone]
        return len(gone)

    def delete_events_before(self, before: float, limit: int) -> int:
        doomed = {e.seq for e in self._events if e.job_id is None and e.time < before}
        doomed = set(sorted(doomed)[:limit])
        self._events = [e for e in self._events if e.seq not in doomed]
        return len(doomed)

    def ended_disk_mb(self, tenants: Iterable[str]) -> dict[str, float]:
        wanted = set(tenants)
        out: dict[str, float] = {}
        for j in self._jobs.values():
            if j.tenant in wanted and j.phase.terminal and j.disk_mb:
                out[j.tenant] = out.get(j.tenant, 0.0) + j.disk_mb
        return out

    def delete_held_time_before(self, before: float, limit: int) -> int:
        hours = sorted(k[1] for k in self._held if k[1] + 3600.0 <= before)
        if not hours or limit <= 0:
            return 0
        last = hours[min(limit, len(hours)) - 1]
        doomed = [k for k in self._held if k[1] <= last]
        for k in doomed:
            del self._held[k]
        return len(doomed)

    def add_held_time(self, rows: Sequence[HeldTime]) -> None:
        for r in rows:
            key = (r.tenant, r.hour, r.gpu)
            service, run, cpu = self._held.get(key, (0.0, 0.0, 0.0))
            self._held[key] = (service + r.service_s, run + r.run_s, cpu + r.cpu_used_s)

    def held_time(self, tenant: str | None = None, since: float | None = None) -> list[HeldTime]:
        first = 0.0 if since is None else hour_of(since)
        sums: dict[tuple[str, bool], tuple[float, float, float]] = {}
        for (t, hour, gpu), (service, run, cpu) in self._held.items():
            if (tenant is None or t == tenant) and hour >= first:
                s, r, c = sums.get((t, gpu), (0.0, 0.0, 0.0))
                sums[(t, gpu)] = (s + service, r + run, c + cpu)
        return [HeldTime(t, first, g, s, r, c) for (t, g), (s, r, c) in sorted(sums.items())]

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
            self._last_seq += 1
            self._events.append(EventRecord(self._last_seq, time, kind, message, job_id, node, data or {}))

    def events(
        self,
        job_id: str | None = None,
        node: str | None = None,
        kinds: Iterable[str] | None = None,
        since_seq: int = 0,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[EventRecord]:
        ks = set(kinds) if kinds is not None else None
        out = [
            e
            for e in self._events
            if e.seq > since_seq
            and (job_id is None or e.job_id == job_id)
            and (node is None or e.node == node)
            and (ks is None or e.kind in ks)
        ][offset:]
        return out[:limit] if limit else out

    def create_tenant(self, tenant: TenantRecord) -> None:
        if tenant.name in self._tenants:
            raise DuplicateError(f"tenant {tenant.name} exists")
        if tenant.name in self._deleted_tenants:
            raise DuplicateError(f"tenant name {tenant.name} belonged to a deleted tenant")
        self._tenants[tenant.name] = copy.copy(tenant)

    def save_tenant(self, tenant: TenantRecord) -> None:
        if tenant.name in self._deleted_tenants:
            raise DuplicateError(f"tenant name {tenant.name} belonged to a deleted tenant")
        self._tenants[tenant.name] = copy.copy(tenant)

    def get_tenant(self, name: str) -> TenantRecord | None:
        return self._tenants.get(name)

    def tenant_by_token_hash(self, token_hash: str) -> TenantRecord | None:
        return next((t for t in self._tenants.values() if t.token_hash == token_hash), None)

    def list_tenants(self, after: str | None = None, limit: int | None = None) -> list[TenantRecord]:
        out = sorted((t for t in self._tenants.values() if after is None or t.name > after), key=lambda t: t.name)
        return out[:limit] if limit else out

    def delete_tenant(self, name: str, at: float = 0.0) -> None:
        self._tenants.pop(name, None)
        self._grants = {g for g in self._grants if g[1] != name}
        self._deleted_tenants.setdefault(name, at)

    def tenant_deleted_at(self, name: str) -> float | None:
        return self._deleted_tenants.get(name)

    def assign_uid(self, tenant: str, lowest: int, highest: int, at: float) -> int:
        if tenant in self._uids:
            return self._uids[tenant]
        uid = max([lowest, *(u + 1 for u in self._uids_taken)])
        if uid > highest:
            raise ValueError(f"the tenant uid range {lowest}..{highest} is spent (settings job_uid_min/max)")
        self._uids[tenant] = uid
        self._uids_taken.add(uid)
        return uid

    def release_uid(self, tenant: str, at: float) -> None:
        self._uids.pop(tenant, None)

    def live_uid_span(self) -> tuple[int, int] | None:
        return (min(self._uids.values()), max(self._uids.values())) if self._uids else None

    def save_queue(self, queue: QueueRecord) -> None:
        self._queues[queue.name] = queue  # frozen: no copy needed

    def get_queue(self, name: str) -> QueueRecord | None:
        return self._queues.get(name)

    def list_queues(self) -> list[QueueRecord]:
        return [self._queues[k] for k in sorted(self._queues)]

    def delete_queue(self, name: str) -> None:
        self._queues.pop(name, None)
        self._grants = {g for g in self._grants if g[0] != name}

    def grant_queue(self, queue: str, tenant: str, granted: bool = True) -> None:
        if granted:
            self._grants.add((queue, tenant))
        else:
            self._grants.discard((queue, tenant))

    def queue_grants(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for q, t in sorted(self._grants):
            out.setdefault(q, []).append(t)
        return out

    def save_priority_class(self, pc: PriorityClass) -> None:
        self._priority_classes[pc.name] = pc  # frozen: no copy needed

    def get_priority_class(self, name: str) -> PriorityClass | None:
        return self._priority_classes.get(name)

    def list_priority_classes(self) -> list[PriorityClass]:
        return [self._priority_classes[k] for k in sorted(self._priority_classes)]

    def delete_priority_class(self, name: str) -> None:
        self._priority_classes.pop(name, None)

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

    def list_datasets(
        self, tenant: str | None = None, after: tuple[str, str] | None = None, limit: int | None = None
    ) -> list[DatasetRecord]:
        out = [
            copy.copy(d)
            for k, d in sorted(self._datasets.items())
            if (tenant is None or k[0] == tenant) and (after is None or k > after)
        ]
        return out[:limit] if limit else out

    def delete_dataset(self, tenant: str, name: str) -> None:
        self._datasets.pop((tenant, name), None)

    def publish_dataset(self, tenant: str, name: str, at: float) -> None:
        if name in self._published:
            raise DuplicateError(f"a dataset named {name} is already published")
        self._published[name] = tenant

    def unpublish_dataset(self, name: str) -> None:
        self._published.pop(name, None)

    def published_datasets(self) -> dict[str, str]:
        return dict(self._published)

    def ping(self) -> None:
        """Memory is always there."""

    def close(self) -> None:
        pass
