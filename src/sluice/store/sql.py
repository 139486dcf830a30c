"""SqlStore: the Store protocol on SQLAlchemy Core — SQLite by default, PostgreSQL by URL.

The API thread and the reconcile thread share one store, so every method opens its own short
transaction from the (thread-safe) engine pool. On SQLite the database runs in WAL mode with
a busy timeout: readers never block the writer and two writers wait for each other instead of
failing with "database is locked".
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Row, create_engine, delete, event, insert, select, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.pool import StaticPool

from sluice.model import Allocation, JobRecord, NodeHealth, Phase
from sluice.spec import DatasetSpec, JobSpec
from sluice.store import schema
from sluice.store.base import DatasetRecord, DuplicateError, EventRecord, NodeRecord, TenantRecord

SQLITE_BUSY_TIMEOUT_MS = 15_000
"""How long a SQLite writer waits for another writer before giving up (ms)."""


def _sqlite_engine(url: str) -> Engine:
    parsed = make_url(url)
    database = parsed.database or ""
    in_memory = database in ("", ":memory:")
    if not in_memory:
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}}
    if in_memory:
        # One shared connection, or every pooled connection would see its own empty database.
        kwargs["poolclass"] = StaticPool
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        if not in_memory:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; WAL keeps it consistent
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.close()

    return engine


def _job_values(job: JobRecord) -> dict[str, Any]:
    return {
        "id": job.id,
        "tenant": job.tenant,
        "name": job.spec.name,
        "phase": job.phase.value,
        "spec": job.spec.model_dump(mode="json"),
        "reason": job.reason,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "attempt": job.attempt,
        "restarts": job.restarts,
        "allocation": None if job.allocation is None else job.allocation.to_list(),
        "exit_code": job.exit_code,
        "checkpoint": job.checkpoint,
        "step": job.step,
        "loss": job.loss,
        "not_before": job.not_before,
        "attained_service": job.attained_service,
        "extra": dict(job.extra),
    }


def _job_from_row(row: Row[Any]) -> JobRecord:
    m = row._mapping
    return JobRecord(
        id=m["id"],
        tenant=m["tenant"],
        spec=JobSpec.model_validate(m["spec"]),
        phase=Phase(m["phase"]),
        reason=m["reason"],
        submitted_at=m["submitted_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        attempt=m["attempt"],
        restarts=m["restarts"],
        allocation=None if m["allocation"] is None else Allocation.from_list(m["allocation"]),
        exit_code=m["exit_code"],
        checkpoint=m["checkpoint"],
        step=m["step"],
        loss=m["loss"],
        not_before=m["not_before"],
        attained_service=m["attained_service"],
        extra=dict(m["extra"] or {}),
    )


def _tenant_from_row(row: Row[Any]) -> TenantRecord:
    m = row._mapping
    return TenantRecord(
        name=m["name"],
        token_hash=m["token_hash"],
        admin=bool(m["admin"]),
        max_running_jobs=m["max_running_jobs"],
        weight=m["weight"],
        created_at=m["created_at"],
    )


def _tenant_values(t: TenantRecord) -> dict[str, Any]:
    return {
        "name": t.name,
        "token_hash": t.token_hash,
        "admin": t.admin,
        "max_running_jobs": t.max_running_jobs,
        "weight": t.weight,
        "created_at": t.created_at,
    }


def _pg_url(url: str) -> URL:
    """A bare postgresql:// URL with a driver that is installed. SQLAlchemy 2.1 defaults to
    psycopg 3; sluice's `postgres` extra installs psycopg2, so pick whichever is present."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        driver = "psycopg" if importlib.util.find_spec("psycopg") else "psycopg2"
        parsed = parsed.set(drivername=f"postgresql+{driver}")
    return parsed


class SqlStore:
    """Durable control-plane state. `url` is any SQLAlchemy URL: sqlite:///path or postgresql://..."""

    def __init__(self, url: str) -> None:
        self.url = url
        if make_url(url).drivername.startswith("sqlite"):
            self._engine = _sqlite_engine(url)
        else:
            self._engine = create_engine(_pg_url(url), pool_pre_ping=True)
        with self._engine.begin() as conn:
            self.schema_version = schema.migrate(conn)

    # jobs ---------------------------------------------------------------------------------
    def create_job(self, job: JobRecord) -> None:
        try:
            with self._engine.begin() as conn:
                conn.execute(insert(schema.jobs).values(**_job_values(job)))
        except IntegrityError:
            raise DuplicateError(f"job {job.id} exists") from None

    def save_job(self, job: JobRecord) -> None:
        values = _job_values(job)
        with self._engine.begin() as conn:
            res = conn.execute(update(schema.jobs).where(schema.jobs.c.id == job.id).values(**values))
            if res.rowcount == 0:
                conn.execute(insert(schema.jobs).values(**values))

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._engine.connect() as conn:
            row = conn.execute(select(schema.jobs).where(schema.jobs.c.id == job_id)).first()
        return _job_from_row(row) if row else None

    def list_jobs(
        self, tenant: str | None = None, phases: Iterable[Phase] | None = None, limit: int | None = None
    ) -> list[JobRecord]:
        q = select(schema.jobs).order_by(schema.jobs.c.submitted_at, schema.jobs.c.id)
        if tenant is not None:
            q = q.where(schema.jobs.c.tenant == tenant)
        if phases is not None:
            q = q.where(schema.jobs.c.phase.in_([Phase(p).value for p in phases]))
        if limit:
            q = q.limit(limit)
        with self._engine.connect() as conn:
            return [_job_from_row(r) for r in conn.execute(q)]

    # events -------------------------------------------------------------------------------
    def append_event(
        self,
        time: float,
        kind: str,
        message: str,
        job_id: str | None = None,
        node: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        with self._engine.begin() as conn:
            conn.execute(
                insert(schema.events).values(
                    time=time, kind=kind, message=message, job_id=job_id, node=node, data=data or {}
                )
            )

    def events(
        self,
        job_id: str | None = None,
        node: str | None = None,
        kinds: Iterable[str] | None = None,
        since_seq: int = 0,
    ) -> list[EventRecord]:
        e = schema.events
        q = select(e).where(e.c.seq > since_seq).order_by(e.c.seq)
        if job_id is not None:
            q = q.where(e.c.job_id == job_id)
        if node is not None:
            q = q.where(e.c.node == node)
        if kinds is not None:
            q = q.where(e.c.kind.in_(list(kinds)))
        with self._engine.connect() as conn:
            return [
                EventRecord(
                    seq=r.seq,
                    time=r.time,
                    kind=r.kind,
                    message=r.message,
                    job_id=r.job_id,
                    node=r.node,
                    data=dict(r.data or {}),
                )
                for r in conn.execute(q)
            ]

    # tenants ------------------------------------------------------------------------------
    def create_tenant(self, tenant: TenantRecord) -> None:
        try:
            with self._engine.begin() as conn:
                conn.execute(insert(schema.tenants).values(**_tenant_values(tenant)))
        except IntegrityError:
            raise DuplicateError(f"tenant {tenant.name} exists") from None

    def save_tenant(self, tenant: TenantRecord) -> None:
        values = _tenant_values(tenant)
        with self._engine.begin() as conn:
            res = conn.execute(update(schema.tenants).where(schema.tenants.c.name == tenant.name).values(**values))
            if res.rowcount == 0:
                conn.execute(insert(schema.tenants).values(**values))

    def get_tenant(self, name: str) -> TenantRecord | None:
        with self._engine.connect() as conn:
            row = conn.execute(select(schema.tenants).where(schema.tenants.c.name == name)).first()
        return _tenant_from_row(row) if row else None

    def tenant_by_token_hash(self, token_hash: str) -> TenantRecord | None:
        with self._engine.connect() as conn:
            row = conn.execute(select(schema.tenants).where(schema.tenants.c.token_hash == token_hash)).first()
        return _tenant_from_row(row) if row else None

    def list_tenants(self) -> list[TenantRecord]:
        with self._engine.connect() as conn:
            return [_tenant_from_row(r) for r in conn.execute(select(schema.tenants).order_by(schema.tenants.c.name))]

    def delete_tenant(self, name: str) -> None:
        with self._engine.begin() as conn:
            conn.execute(delete(schema.tenants).where(schema.tenants.c.name == name))

    # nodes --------------------------------------------------------------------------------
    def save_node(self, node: NodeRecord) -> None:
        values = {
            "name": node.name,
            "health": NodeHealth(node.health).value,
            "reason": node.reason,
            "cordoned_by": node.cordoned_by,
            "updated_at": node.updated_at,
        }
        with self._engine.begin() as conn:
            res = conn.execute(update(schema.nodes).where(schema.nodes.c.name == node.name).values(**values))
            if res.rowcount == 0:
                conn.execute(insert(schema.nodes).values(**values))

    def list_nodes(self) -> list[NodeRecord]:
        with self._engine.connect() as conn:
            rows = conn.execute(select(schema.nodes).order_by(schema.nodes.c.name))
            return [
                NodeRecord(
                    name=r.name,
                    health=NodeHealth(r.health),
                    reason=r.reason,
                    cordoned_by=r.cordoned_by,
                    updated_at=r.updated_at,
                )
                for r in rows
            ]

    # datasets -----------------------------------------------------------------------------
    @staticmethod
    def _dataset_values(d: DatasetRecord) -> dict[str, Any]:
        return {
            "tenant": d.tenant,
            "name": d.name,
            "spec": d.spec.model_dump(mode="json"),
            "created_at": d.created_at,
            "items": d.items,
            "total_bytes": d.total_bytes,
        }

    @staticmethod
    def _dataset_from_row(row: Row[Any]) -> DatasetRecord:
        m = row._mapping
        return DatasetRecord(
            tenant=m["tenant"],
            name=m["name"],
            spec=DatasetSpec.model_validate(m["spec"]),
            created_at=m["created_at"],
            items=m["items"],
            total_bytes=m["total_bytes"],
        )

    def create_dataset(self, ds: DatasetRecord) -> None:
        try:
            with self._engine.begin() as conn:
                conn.execute(insert(schema.datasets).values(**self._dataset_values(ds)))
        except IntegrityError:
            raise DuplicateError(f"dataset {ds.tenant}/{ds.name} exists") from None

    def save_dataset(self, ds: DatasetRecord) -> None:
        t = schema.datasets
        with self._engine.begin() as conn:
            values = self._dataset_values(ds)
            done = conn.execute(update(t).where(t.c.tenant == ds.tenant, t.c.name == ds.name).values(**values))
            if done.rowcount == 0:
                conn.execute(insert(t).values(**values))

    def get_dataset(self, tenant: str, name: str) -> DatasetRecord | None:
        t = schema.datasets
        with self._engine.connect() as conn:
            row = conn.execute(select(t).where(t.c.tenant == tenant, t.c.name == name)).first()
        return self._dataset_from_row(row) if row else None

    def list_datasets(self, tenant: str | None = None) -> list[DatasetRecord]:
        t = schema.datasets
        q = select(t).order_by(t.c.tenant, t.c.name)
        if tenant is not None:
            q = q.where(t.c.tenant == tenant)
        with self._engine.connect() as conn:
            return [self._dataset_from_row(r) for r in conn.execute(q)]

    def delete_dataset(self, tenant: str, name: str) -> None:
        t = schema.datasets
        with self._engine.begin() as conn:
            conn.execute(delete(t).where(t.c.tenant == tenant, t.c.name == name))

    def close(self) -> None:
        self._engine.dispose()
