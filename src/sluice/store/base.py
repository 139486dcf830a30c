"""The Store protocol: durable job/tenant/node state plus an append-only event log.

Two implementations: `SqlStore` (SQLAlchemy; SQLite by default, PostgreSQL by URL) for the
control plane, and `MemoryStore` for the simulator, where durability buys nothing and a
day of a thousand-node cluster must run in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sluice.model import JobRecord, NodeHealth, Phase
from sluice.model.queue import PriorityClass, QueueConfig
from sluice.spec import DatasetSpec


@dataclass(frozen=True)
class EventRecord:
    """One line of a job's (or node's) history. `kind` is e.g. phase, decision, exit, resize."""

    seq: int
    time: float
    kind: str
    message: str
    job_id: str | None = None
    node: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NewEvent:
    """An event to append, written in the same transaction as the record it explains."""

    time: float
    kind: str
    message: str
    job_id: str | None = None
    node: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class TenantRecord:
    name: str
    token_hash: str
    admin: bool = False
    max_running_jobs: int | None = None
    weight: float = 1.0
    created_at: float = 0.0
    max_priority: int | None = None
    """The highest priority its jobs may be submitted or resumed with; None: no cap."""
    max_disk_mb: int | None = None
    """MiB its jobs' run folders may hold (ended jobs' included) before its pending jobs wait;
    None: no cap."""


@dataclass(frozen=True)
class QueueRecord:
    """A queue as an admin made it (docs/queues.md): its quotas live in `config`; the
    tenants it is granted to are kept separately (`grant_queue`)."""

    config: QueueConfig
    created_at: float = 0.0

    @property
    def name(self) -> str:
        return self.config.name


@dataclass
class NodeRecord:
    """Operator- and detector-set node state that must survive a restart."""

    name: str
    health: NodeHealth = NodeHealth.HEALTHY
    reason: str = ""
    cordoned_by: str | None = None  # "operator" or "detector"
    updated_at: float = 0.0


@dataclass
class DatasetRecord:
    """A registered dataset: its spec, owner, and what a listing of its source found."""

    tenant: str
    name: str
    spec: DatasetSpec
    created_at: float = 0.0
    items: int | None = None
    total_bytes: int | None = None


@dataclass(frozen=True)
class UsageRow:
    """One group of a tenant's jobs for an accounting report: those in one phase that do or
    do not use GPUs, with what they received in all (`JobRecord.attained_service`: GPU-seconds
    for GPU jobs, guaranteed core-seconds for the others) and ran (`run_s`)."""

    tenant: str
    phase: str
    gpu: bool
    jobs: int
    service_s: float
    run_s: float
    restarts: int


@dataclass(frozen=True)
class HeldTime:
    """What one tenant's jobs held in one hour (`hour`: its start, Unix seconds), those with
    GPUs apart from the others: `service_s` GPU-seconds (or guaranteed core-seconds) and
    `run_s` job-seconds run, as `JobRecord.attained_service` and `run_s` count them, and
    `cpu_used_s` the CPU-seconds their processes used (`JobRecord.cpu_used_s`)."""

    tenant: str
    hour: float
    gpu: bool
    service_s: float
    run_s: float
    cpu_used_s: float = 0.0


def hour_of(t: float) -> float:
    """The start of the hour (Unix seconds) that `t` falls in."""
    return float(int(t // 3600) * 3600)


class Store(Protocol):
    def create_job(self, job: JobRecord, events: Sequence[NewEvent] = ()) -> None:
        """Insert a new job and its events in one transaction (DuplicateError if it exists)."""
        ...

    def create_jobs(self, jobs: Sequence[tuple[JobRecord, Sequence[NewEvent]]]) -> None:
        """Insert new jobs, each with its events, in one transaction: all or none (a job
        array); DuplicateError if one exists."""
        ...

    def save_job(self, job: JobRecord, events: Sequence[NewEvent] = ()) -> None:
        """Write the job's whole record and append `events`, atomically: both or neither."""
        ...

    def get_job(self, job_id: str) -> JobRecord | None: ...
    def list_jobs(
        self,
        tenant: str | None = None,
        phases: Iterable[Phase] | None = None,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[JobRecord]:
        """Jobs ordered by (submitted_at, id); `after` = only those strictly after that key."""
        ...

    def job_phases(self, job_ids: Sequence[str]) -> dict[str, Phase]:
        """The phase of each of these jobs that exists (an unknown id is left out): one read of
        two columns, not of whole records (`GET /v1/jobs?array=&phase=` filters an array's
        jobs by it before reading the ones it lists)."""
        ...

    def count_jobs(self) -> dict[str, int]:
        """Jobs by phase value (for metrics: a scrape must not read every record)."""
        ...

    def job_usage(self, tenant: str | None = None, since: float | None = None) -> list[UsageRow]:
        """Jobs submitted at or after `since` (None: all), of `tenant` (None: every one),
        summed by tenant, phase and GPU use: one grouped read, however many jobs there are."""
        ...

    def ended_before(self, before: float, limit: int, after: tuple[float, str] | None = None) -> list[JobRecord]:
        """Up to `limit` ended jobs (Succeeded, Failed, Cancelled) that finished before `before`,
        ordered by (finished_at, id); `after`: only those strictly after that key. The
        candidates of job retention (`control/retention.py`)."""
        ...

    def delete_jobs(self, job_ids: Sequence[str]) -> int:
        """Delete these jobs and every event of theirs in one transaction; how many jobs were
        deleted (an unknown id is skipped). Retention's: nothing else removes a job."""
        ...

    def delete_events_before(self, before: float, limit: int) -> int:
        """Delete up to `limit` of the oldest events that belong to no job (node health,
        cordons, plane notes) and happened before `before`; how many. A job's own events go
        with the job (`delete_jobs`)."""
        ...

    def ended_disk_mb(self, tenants: Iterable[str]) -> dict[str, float]:
        """Per tenant of `tenants`, the MiB its ended jobs' run folders held at their last disk
        check (`JobRecord.disk_mb`), summed; a tenant with none is left out."""
        ...

    def delete_held_time_before(self, before: float, limit: int) -> int:
        """Delete the held time of the oldest whole hours that ended by `before` (usage
        retention), about `limit` rows (every row of the last hour reached goes, so a few
        more); how many."""
        ...

    def add_held_time(self, rows: Sequence[HeldTime]) -> None:
        """Add each row to its (tenant, hour, gpu) total, made at 0 if new; in one transaction."""
        ...

    def held_time(self, tenant: str | None = None, since: float | None = None) -> list[HeldTime]:
        """Per (tenant, gpu), what was held in the hours from the one `since` falls in on (None:
        all), of `tenant` (None: every one); `hour` is the first hour summed (0 for all)."""
        ...

    def append_event(
        self,
        time: float,
        kind: str,
        message: str,
        job_id: str | None = None,
        node: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None: ...
    def events(
        self,
        job_id: str | None = None,
        node: str | None = None,
        kinds: Iterable[str] | None = None,
        since_seq: int = 0,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[EventRecord]:
        """Events in order, after `since_seq`, the first `offset` of those skipped."""
        ...

    def create_tenant(self, tenant: TenantRecord) -> None:
        """Insert a tenant: DuplicateError if one of that name exists or ever existed (a deleted
        tenant's name is never given out again, see `delete_tenant`)."""
        ...

    def save_tenant(self, tenant: TenantRecord) -> None: ...
    def get_tenant(self, name: str) -> TenantRecord | None: ...
    def tenant_by_token_hash(self, token_hash: str) -> TenantRecord | None: ...
    def list_tenants(self, after: str | None = None, limit: int | None = None) -> list[TenantRecord]:
        """Tenants ordered by name; `after` = only names strictly after it."""
        ...

    def delete_tenant(self, name: str, at: float = 0.0) -> None:
        """Delete the tenant and its queue grants, and record its name as deleted (at `at`), in
        one transaction. Its jobs, datasets and uid keep its name; since the name is never
        given to another tenant, none of them can come to belong to a newcomer."""
        ...

    def tenant_deleted_at(self, name: str) -> float | None:
        """When a tenant of that name was deleted; None if none was."""
        ...

    def assign_uid(self, tenant: str, lowest: int, highest: int, at: float) -> int:
        """The uid the tenant's jobs run as: its current one, else the next never-used number in
        [lowest, highest] (ValueError when the range is spent)."""
        ...

    def release_uid(self, tenant: str, at: float) -> None:
        """The tenant is gone: its uid stays taken, but no longer maps to it."""
        ...

    def live_uid_span(self) -> tuple[int, int] | None:
        """The lowest and highest uid a tenant that is not deleted runs its jobs as (None: no
        tenant has one yet). Given under an earlier job_uid_min..max, they may lie outside the
        range set now: the host-wide range check must see them too (agent/uid_ranges.py)."""
        ...

    def save_node(self, node: NodeRecord) -> None: ...
    def list_nodes(self) -> list[NodeRecord]: ...
    def create_dataset(self, ds: DatasetRecord) -> None: ...
    def save_dataset(self, ds: DatasetRecord) -> None: ...
    def get_dataset(self, tenant: str, name: str) -> DatasetRecord | None: ...
    def list_datasets(
        self, tenant: str | None = None, after: tuple[str, str] | None = None, limit: int | None = None
    ) -> list[DatasetRecord]:
        """Datasets ordered by (tenant, name); `after` = only those strictly after that key."""
        ...

    def delete_dataset(self, tenant: str, name: str) -> None: ...
    def publish_dataset(self, tenant: str, name: str, at: float) -> None:
        """Publish tenant's dataset `name` to every tenant (DuplicateError if a dataset of that
        name is already published)."""
        ...

    def unpublish_dataset(self, name: str) -> None: ...
    def published_datasets(self) -> dict[str, str]:
        """Published dataset name -> owning tenant."""
        ...

    def save_queue(self, queue: QueueRecord) -> None:
        """Create or replace a queue (its grants are kept)."""
        ...

    def get_queue(self, name: str) -> QueueRecord | None: ...
    def list_queues(self) -> list[QueueRecord]: ...
    def delete_queue(self, name: str) -> None:
        """Delete a queue and its grants."""
        ...

    def grant_queue(self, queue: str, tenant: str, granted: bool = True) -> None:
        """Grant `tenant` the use of `queue` (or take it away with granted=False)."""
        ...

    def queue_grants(self) -> dict[str, list[str]]:
        """queue -> the tenants granted it, sorted."""
        ...

    def save_priority_class(self, pc: PriorityClass) -> None:
        """Create or replace a priority class (docs/queues.md)."""
        ...

    def get_priority_class(self, name: str) -> PriorityClass | None: ...
    def list_priority_classes(self) -> list[PriorityClass]:
        """Every priority class, by name."""
        ...

    def delete_priority_class(self, name: str) -> None: ...

    def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers now (readiness, /healthz)."""
        ...

    def close(self) -> None: ...


class DuplicateError(ValueError):
    """A record with that key already exists."""


class StoreInUse(RuntimeError):
    """Another control plane holds the database (`SqlStore.claim`): two planes on one database
    would each take the other's running jobs for gone and run them again."""


class StoreNotOpened(RuntimeError):
    """The database cannot be opened at all: a URL SQLAlchemy cannot read, a database kind or
    driver sluice does not have, or a server that refuses the connection (no such database,
    wrong password, nothing listening). Said in one line, the URL's password hidden."""


class StoreUnavailable(RuntimeError):
    """The store cannot take a write now (disk full, read-only file system, I/O error, the
    database server gone), or cannot be read (the server gone). Nothing of a failed write was
    kept; reads may still work. The API answers 503 with this reason, /healthz is 503 while
    `ping` fails, and the controller retries the round later."""
