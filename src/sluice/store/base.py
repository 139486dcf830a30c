"""The Store protocol: durable job/tenant/node state plus an append-only event log.

Two implementations: `SqlStore` (SQLAlchemy; SQLite by default, PostgreSQL by URL) for the
control plane, and `MemoryStore` for the simulator, where durability buys nothing and a
day of a thousand-node cluster must run in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sluice.model import JobRecord, NodeHealth, Phase
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


@dataclass
class TenantRecord:
    name: str
    token_hash: str
    admin: bool = False
    max_running_jobs: int | None = None
    weight: float = 1.0
    created_at: float = 0.0


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


class Store(Protocol):
    def create_job(self, job: JobRecord) -> None: ...
    def save_job(self, job: JobRecord) -> None: ...
    def get_job(self, job_id: str) -> JobRecord | None: ...
    def list_jobs(
        self, tenant: str | None = None, phases: Iterable[Phase] | None = None, limit: int | None = None
    ) -> list[JobRecord]: ...
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
    ) -> list[EventRecord]: ...
    def create_tenant(self, tenant: TenantRecord) -> None: ...
    def save_tenant(self, tenant: TenantRecord) -> None: ...
    def get_tenant(self, name: str) -> TenantRecord | None: ...
    def tenant_by_token_hash(self, token_hash: str) -> TenantRecord | None: ...
    def list_tenants(self) -> list[TenantRecord]: ...
    def delete_tenant(self, name: str) -> None: ...
    def save_node(self, node: NodeRecord) -> None: ...
    def list_nodes(self) -> list[NodeRecord]: ...
    def create_dataset(self, ds: DatasetRecord) -> None: ...
    def save_dataset(self, ds: DatasetRecord) -> None: ...
    def get_dataset(self, tenant: str, name: str) -> DatasetRecord | None: ...
    def list_datasets(self, tenant: str | None = None) -> list[DatasetRecord]: ...
    def delete_dataset(self, tenant: str, name: str) -> None: ...
    def close(self) -> None: ...


class DuplicateError(ValueError):
    """A record with that key already exists."""
