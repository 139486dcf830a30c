"""SqlStore: the Store protocol on SQLAlchemy Core — SQLite by default, PostgreSQL by URL.

The API thread and the reconcile thread share one store, so every method opens its own short
transaction from the (thread-safe) engine pool. On SQLite the database runs in WAL mode with
a busy timeout: readers never block the writer and two writers wait for each other instead of
failing with "database is locked".
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import stat
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    and_,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError, OperationalError
from sqlalchemy.pool import StaticPool

from sluice.model import Allocation, JobRecord, NodeHealth, Phase, StopIntent
from sluice.model.queue import Limits, PriorityClass, QueueConfig, Reclaim, WithinQueue
from sluice.spec import DatasetSpec, JobSpec
from sluice.store import schema
from sluice.store.base import (
    DatasetRecord,
    DuplicateError,
    EventRecord,
    HeldTime,
    NewEvent,
    NodeRecord,
    QueueRecord,
    StoreInUse,
    StoreNotOpened,
    StoreUnavailable,
    TenantRecord,
    UsageRow,
    hour_of,
)

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 15_000
"""How long a SQLite writer waits for another writer before giving up (ms)."""


def _private_database(path: Path) -> None:
    """The database and its -wal/-shm/-journal companions readable by their owner only: the
    WAL holds token hashes and job environments. SQLite gives a companion file the mode of the
    database file, so creating that one 0600 (before SQLite does) covers the rest; the chmods
    fix files an older sluice made 0644."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # exists, or cannot be made: SQLite says why when it connects
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    for f in (path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal"))):
        with contextlib.suppress(OSError):
            if stat.S_IMODE(f.stat().st_mode) != 0o600:
                f.chmod(0o600)


def _sqlite_engine(url: str) -> Engine:
    parsed = make_url(url)
    database = parsed.database or ""
    in_memory = database in ("", ":memory:")
    if not in_memory:
        _private_database(Path(database).expanduser())
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
            _private_database(Path(database).expanduser())
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
        "extra": {},
        "checkpoint_step": job.checkpoint_step,
        "stop_intent": None if job.stop_intent is None else job.stop_intent.to_dict(),
        "requeues": job.requeues,
        "last_stop_s": job.last_stop_s,
        "qoe_met_at": job.qoe_met_at,
        "run_s": job.run_s,
        "run_until": job.run_until,
        "cpu_used_s": job.cpu_used_s,
        "attempt_cpu_s": job.attempt_cpu_s,
        "disk_mb": job.disk_mb,
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
        checkpoint_step=m["checkpoint_step"],
        stop_intent=None if m["stop_intent"] is None else StopIntent.from_dict(m["stop_intent"]),
        requeues=m["requeues"] or 0,
        last_stop_s=m["last_stop_s"],
        qoe_met_at=m["qoe_met_at"],
        run_s=m["run_s"] or 0.0,
        run_until=m["run_until"],
        cpu_used_s=m["cpu_used_s"] or 0.0,
        attempt_cpu_s=m["attempt_cpu_s"] or 0.0,
        disk_mb=m["disk_mb"],
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
        max_priority=m["max_priority"],
        max_disk_mb=m["max_disk_mb"],
    )


def _priority_class_from_row(row: Row[Any]) -> PriorityClass:
    return PriorityClass(
        name=row.name,
        value=int(row.value),
        description=row.description or "",
        preempts=bool(row.preempts),
        default=bool(row.is_default),
        created_at=float(row.created_at),
    )


def _queue_from_row(row: Row[Any]) -> QueueRecord:
    config = QueueConfig(
        name=row.name,
        cohort=row.cohort,
        nominal=Limits.from_dict(row.nominal),
        borrowing_limit=Limits.from_dict(row.borrowing_limit),
        lending_limit=Limits.from_dict(row.lending_limit),
        weight=float(row.weight),
        reclaim_within_cohort=Reclaim((row.preemption or {}).get("reclaim_within_cohort", Reclaim.ANY)),
        within_queue=WithinQueue((row.preemption or {}).get("within_queue", WithinQueue.LOWER_PRIORITY)),
        max_runtime_s=row.max_runtime_s,
    )
    return QueueRecord(config, float(row.created_at))


def _tenant_values(t: TenantRecord) -> dict[str, Any]:
    return {
        "name": t.name,
        "token_hash": t.token_hash,
        "admin": t.admin,
        "max_running_jobs": t.max_running_jobs,
        "weight": t.weight,
        "created_at": t.created_at,
        "max_priority": t.max_priority,
        "max_disk_mb": t.max_disk_mb,
    }


_MEDIUM_FAILURES = ("disk is full", "readonly", "read-only", "disk i/o error", "unable to open", "no space")


def _is_medium_failure(err: DBAPIError) -> bool:
    return any(m in str(err.orig).lower() for m in _MEDIUM_FAILURES)


def _reason(err: DBAPIError) -> str:
    return str(err.orig).strip().splitlines()[0] if err.orig is not None else str(err)


def _pg_url(url: str) -> URL:
    """A bare postgresql:// URL with a driver that is installed. SQLAlchemy 2.1 defaults to
    psycopg 3; sluice's `postgres` extra installs psycopg2, so pick whichever is present."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        driver = "psycopg" if importlib.util.find_spec("psycopg") else "psycopg2"
        parsed = parsed.set(drivername=f"postgresql+{driver}")
    return parsed


PG_CONNECT_ARGS: dict[str, int] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
"""libpq settings of every PostgreSQL connection (seconds; tcp_user_timeout in ms), unless the
URL's query names them: a network that drops packets (a partition, not a reset) ends a read
within about 30 s. Without them a read waited for the kernel's retransmissions, ~15 min, and
the reconcile loop, which checks the plane's hold on the database every round, stopped with it."""

_IN_BATCH = 500
"""Most ids one `IN (...)` of a delete names: SQLite allows 32,766 bound parameters a
statement, older builds 999."""

PLANE_LOCK_KEY = 0x736C75696365
"""PostgreSQL advisory-lock key a control plane holds its database with ("sluice" in ASCII)."""


class SqlStore:
    """Durable control-plane state. `url` is any SQLAlchemy URL: sqlite:///path or postgresql://..."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._claim: int | Connection | None = None
        self._holds_pg = False  # claimed a PostgreSQL database: keep_claim checks the session
        self._claim_tag = f"sluice-plane-{uuid.uuid4().hex[:16]}"
        """This store's claim session's application_name: after a network cut the server may
        keep the old session (and its lock) alive for hours, and only this tag tells this
        plane's own lingering session from another plane's. Random unless `claim` is given
        the plane's lasting one (its home's), which its dead predecessor's session carries."""
        # A URL sluice cannot use, or a server that refuses it, was a traceback from `sluice up`.
        try:
            shown = make_url(url).render_as_string(hide_password=True)
        except ArgumentError:
            raise StoreNotOpened(
                "not a database URL: use sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE"
            ) from None
        try:
            if make_url(url).drivername.startswith("sqlite"):
                self._engine = _sqlite_engine(url)
            else:
                parsed = _pg_url(url)
                args = {k: v for k, v in PG_CONNECT_ARGS.items() if k not in parsed.query}
                self._engine = create_engine(parsed, pool_pre_ping=True, connect_args=args)
        except (NoSuchModuleError, ImportError) as err:
            raise StoreNotOpened(
                f"{shown}: sluice cannot open this kind of database ({err}); use sqlite:///PATH or "
                "postgresql://USER@HOST:PORT/DATABASE"
            ) from None
        try:
            with self._engine.begin() as conn:
                self.schema_version = schema.migrate(conn)
        except OperationalError as err:
            self._engine.dispose()
            raise StoreNotOpened(f"{shown}: cannot connect: {_reason(err)}") from None

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """One write transaction. A failure of the medium (disk full, read-only, I/O error,
        server gone) becomes StoreUnavailable with the database's own words; the transaction
        is rolled back, so nothing of it was kept."""
        try:
            with self._engine.begin() as conn:
                yield conn
        except IntegrityError:
            raise
        except OperationalError as err:
            raise StoreUnavailable(f"the database cannot take writes: {_reason(err)}") from err
        except DBAPIError as err:
            if _is_medium_failure(err):
                raise StoreUnavailable(f"the database cannot take writes: {_reason(err)}") from err
            raise

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        """One read. The database gone (PostgreSQL stopped, the file unreadable) becomes
        StoreUnavailable with the database's own words, which the API answers with a 503 (a
        client may retry) instead of a bare 500, and the reconcile loop waits out."""
        try:
            with self._engine.connect() as conn:
                yield conn
        except OperationalError as err:
            raise StoreUnavailable(f"the database cannot be read: {_reason(err)}") from err

    def ping(self) -> None:
        """StoreUnavailable unless the database answers a trivial query now (/healthz)."""
        with self._read() as conn:
            conn.exec_driver_sql("SELECT 1")

    # jobs ---------------------------------------------------------------------------------
    def create_job(self, job: JobRecord, events: Sequence[NewEvent] = ()) -> None:
        try:
            with self._write() as conn:
                conn.execute(insert(schema.jobs).values(**_job_values(job)))
                self._insert_events(conn, events)
        except IntegrityError:
            raise DuplicateError(f"job {job.id} exists") from None

    def create_jobs(self, jobs: Sequence[tuple[JobRecord, Sequence[NewEvent]]]) -> None:
        try:
            with self._write() as conn:
                for job, events in jobs:
                    conn.execute(insert(schema.jobs).values(**_job_values(job)))
                    self._insert_events(conn, events)
        except IntegrityError:
            raise DuplicateError(f"one of jobs {jobs[0][0].id}.. exists") from None

    def save_job(self, job: JobRecord, events: Sequence[NewEvent] = ()) -> None:
        values = _job_values(job)
        with self._write() as conn:
            res = conn.execute(update(schema.jobs).where(schema.jobs.c.id == job.id).values(**values))
            if res.rowcount == 0:
                conn.execute(insert(schema.jobs).values(**values))
            self._insert_events(conn, events)

    @staticmethod
    def _insert_events(conn: Connection, events: Sequence[NewEvent]) -> None:
        if events:
            conn.execute(
                insert(schema.events),
                [
                    {
                        "time": e.time,
                        "kind": e.kind,
                        "message": e.message,
                        "job_id": e.job_id,
                        "node": e.node,
                        "data": e.data or {},
                    }
                    for e in events
                ],
            )

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._read() as conn:
            row = conn.execute(select(schema.jobs).where(schema.jobs.c.id == job_id)).first()
        return _job_from_row(row) if row else None

    def list_jobs(
        self,
        tenant: str | None = None,
        phases: Iterable[Phase] | None = None,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[JobRecord]:
        q = select(schema.jobs).order_by(schema.jobs.c.submitted_at, schema.jobs.c.id)
        if after is not None:  # keyset pagination: (submitted_at, id) > after
            t, jid = after
            c = schema.jobs.c
            q = q.where(or_(c.submitted_at > t, and_(c.submitted_at == t, c.id > jid)))
        if tenant is not None:
            q = q.where(schema.jobs.c.tenant == tenant)
        if phases is not None:
            q = q.where(schema.jobs.c.phase.in_([Phase(p).value for p in phases]))
        if limit:
            q = q.limit(limit)
        with self._read() as conn:
            return [_job_from_row(r) for r in conn.execute(q)]

    def job_phases(self, job_ids: Sequence[str]) -> dict[str, Phase]:
        ids = list(dict.fromkeys(job_ids))
        c = schema.jobs.c
        out: dict[str, Phase] = {}
        with self._read() as conn:
            for i in range(0, len(ids), _IN_BATCH):  # a bound on the statement's parameters
                q = select(c.id, c.phase).where(c.id.in_(ids[i : i + _IN_BATCH]))
                out.update((str(jid), Phase(phase)) for jid, phase in conn.execute(q))
        return out

    def count_jobs(self) -> dict[str, int]:
        q = select(schema.jobs.c.phase, func.count()).group_by(schema.jobs.c.phase)
        with self._read() as conn:
            return {str(phase): int(n) for phase, n in conn.execute(q)}

    def job_usage(self, tenant: str | None = None, since: float | None = None) -> list[UsageRow]:
        c = schema.jobs.c
        gpu = (func.coalesce(c.spec[("resources", "gpus")].as_integer(), 0) > 0).label("gpu")
        q = select(
            c.tenant, c.phase, gpu, func.count(), func.sum(c.attained_service), func.sum(c.run_s), func.sum(c.restarts)
        ).group_by(c.tenant, c.phase, gpu)
        if tenant is not None:
            q = q.where(c.tenant == tenant)
        if since is not None:
            q = q.where(c.submitted_at >= since)
        with self._read() as conn:
            rows = [
                UsageRow(str(t), str(p), bool(g), int(n), float(s or 0), float(r or 0), int(k or 0))
                for t, p, g, n, s, r, k in conn.execute(q)
            ]
        return sorted(rows, key=lambda u: (u.tenant, u.phase, u.gpu))

    def ended_before(self, before: float, limit: int, after: tuple[float, str] | None = None) -> list[JobRecord]:
        c = schema.jobs.c
        ended = [p.value for p in Phase if p.terminal]
        # `phase || ''`: an expression, so SQLite reads the finished_at index in order and stops
        # at `limit`; on the bare column it chose the phase index (an equality) and sorted every
        # ended job by finish time for each batch. The keyset's `>=` is that index's range.
        q = (
            select(schema.jobs)
            .where(c.finished_at < before, c.phase.concat("").in_(ended))
            .order_by(c.finished_at, c.id)
            .limit(limit)
        )
        if after is not None:  # keyset: (finished_at, id) > after
            t, jid = after
            q = q.where(c.finished_at >= t, or_(c.finished_at > t, c.id > jid))
        with self._read() as conn:
            return [_job_from_row(r) for r in conn.execute(q)]

    def delete_jobs(self, job_ids: Sequence[str]) -> int:
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return 0
        gone = 0
        with self._write() as conn:
            for i in range(0, len(ids), _IN_BATCH):  # a bound on the statement's parameters
                part = ids[i : i + _IN_BATCH]
                conn.execute(delete(schema.events).where(schema.events.c.job_id.in_(part)))
                gone += conn.execute(delete(schema.jobs).where(schema.jobs.c.id.in_(part))).rowcount
        return gone

    def delete_events_before(self, before: float, limit: int) -> int:
        e = schema.events.c
        oldest = select(e.seq).where(e.job_id.is_(None), e.time < before).order_by(e.seq).limit(limit)
        with self._write() as conn:
            seqs = [r[0] for r in conn.execute(oldest)]
            for i in range(0, len(seqs), _IN_BATCH):
                conn.execute(delete(schema.events).where(e.seq.in_(seqs[i : i + _IN_BATCH])))
        return len(seqs)

    def ended_disk_mb(self, tenants: Iterable[str]) -> dict[str, float]:
        c = schema.jobs.c
        wanted = list(dict.fromkeys(tenants))
        ended = [p.value for p in Phase if p.terminal]
        out: dict[str, float] = {}
        with self._read() as conn:
            for i in range(0, len(wanted), _IN_BATCH):
                q = (
                    select(c.tenant, func.sum(c.disk_mb))
                    .where(c.tenant.in_(wanted[i : i + _IN_BATCH]), c.phase.in_(ended), c.disk_mb.is_not(None))
                    .group_by(c.tenant)
                )
                out.update({str(t): float(mb) for t, mb in conn.execute(q) if mb})
        return out

    def delete_held_time_before(self, before: float, limit: int) -> int:
        c = schema.held_time.c
        if limit <= 0:
            return 0
        # The hour of the limit-th oldest row: every row up to that hour goes (rows of one hour
        # are one per tenant and kind, so a batch passes `limit` by at most one hour's worth).
        ended = c.hour <= before - 3600.0  # on the column, not an expression of it: the index serves it
        nth = select(c.hour).where(ended).order_by(c.hour).offset(limit - 1).limit(1)
        with self._write() as conn:
            last = conn.execute(nth).scalar()
            if last is None:  # fewer than `limit` rows old enough: all of them
                last = conn.execute(select(func.max(c.hour)).where(ended)).scalar()
            if last is None:
                return 0
            return int(conn.execute(delete(schema.held_time).where(c.hour <= last)).rowcount)

    def add_held_time(self, rows: Sequence[HeldTime]) -> None:
        if not rows:
            return
        from sqlalchemy.dialects import postgresql, sqlite

        t = schema.held_time
        dialect = postgresql if self._engine.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(t)
        stmt = stmt.on_conflict_do_update(
            index_elements=[t.c.tenant, t.c.hour, t.c.gpu],
            set_={
                "service_s": t.c.service_s + stmt.excluded.service_s,
                "run_s": t.c.run_s + stmt.excluded.run_s,
                "cpu_used_s": t.c.cpu_used_s + stmt.excluded.cpu_used_s,
            },
        )
        values = [
            {
                "tenant": r.tenant,
                "hour": r.hour,
                "gpu": r.gpu,
                "service_s": r.service_s,
                "run_s": r.run_s,
                "cpu_used_s": r.cpu_used_s,
            }
            for r in rows
        ]
        with self._write() as conn:
            conn.execute(stmt, values)

    def held_time(self, tenant: str | None = None, since: float | None = None) -> list[HeldTime]:
        c = schema.held_time.c
        first = 0.0 if since is None else hour_of(since)
        q = select(c.tenant, c.gpu, func.sum(c.service_s), func.sum(c.run_s), func.sum(c.cpu_used_s)).where(
            c.hour >= first
        )
        if tenant is not None:
            q = q.where(c.tenant == tenant)
        with self._read() as conn:
            rows = conn.execute(q.group_by(c.tenant, c.gpu)).all()
        return sorted(
            (HeldTime(str(t), first, bool(g), float(s or 0), float(r or 0), float(u or 0)) for t, g, s, r, u in rows),
            key=lambda h: (h.tenant, h.gpu),
        )

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
        with self._write() as conn:
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
        limit: int | None = None,
        offset: int = 0,
    ) -> list[EventRecord]:
        e = schema.events
        q = select(e).where(e.c.seq > since_seq).order_by(e.c.seq)
        if limit:
            q = q.limit(limit)
        if offset:
            q = q.offset(offset)
        if job_id is not None:
            q = q.where(e.c.job_id == job_id)
        if node is not None:
            q = q.where(e.c.node == node)
        if kinds is not None:
            q = q.where(e.c.kind.in_(list(kinds)))
        with self._read() as conn:
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
        gone = schema.deleted_tenants
        try:
            with self._write() as conn:
                if conn.execute(select(gone.c.name).where(gone.c.name == tenant.name)).first() is not None:
                    raise DuplicateError(f"tenant name {tenant.name} belonged to a deleted tenant")
                conn.execute(insert(schema.tenants).values(**_tenant_values(tenant)))
        except IntegrityError:
            raise DuplicateError(f"tenant {tenant.name} exists") from None

    def save_tenant(self, tenant: TenantRecord) -> None:
        values = _tenant_values(tenant)
        with self._write() as conn:
            res = conn.execute(update(schema.tenants).where(schema.tenants.c.name == tenant.name).values(**values))
            if res.rowcount == 0:
                gone = schema.deleted_tenants
                if conn.execute(select(gone.c.name).where(gone.c.name == tenant.name)).first() is not None:
                    raise DuplicateError(f"tenant name {tenant.name} belonged to a deleted tenant")
                conn.execute(insert(schema.tenants).values(**values))

    def get_tenant(self, name: str) -> TenantRecord | None:
        with self._read() as conn:
            row = conn.execute(select(schema.tenants).where(schema.tenants.c.name == name)).first()
        return _tenant_from_row(row) if row else None

    def tenant_by_token_hash(self, token_hash: str) -> TenantRecord | None:
        with self._read() as conn:
            row = conn.execute(select(schema.tenants).where(schema.tenants.c.token_hash == token_hash)).first()
        return _tenant_from_row(row) if row else None

    def list_tenants(self, after: str | None = None, limit: int | None = None) -> list[TenantRecord]:
        q = select(schema.tenants).order_by(schema.tenants.c.name)
        if after is not None:
            q = q.where(schema.tenants.c.name > after)
        if limit:
            q = q.limit(limit)
        with self._read() as conn:
            return [_tenant_from_row(r) for r in conn.execute(q)]

    def delete_tenant(self, name: str, at: float = 0.0) -> None:
        gone = schema.deleted_tenants
        with self._write() as conn:
            conn.execute(delete(schema.tenants).where(schema.tenants.c.name == name))
            conn.execute(delete(schema.queue_grants).where(schema.queue_grants.c.tenant == name))
            if conn.execute(select(gone.c.name).where(gone.c.name == name)).first() is None:
                conn.execute(insert(gone).values(name=name, deleted_at=at))

    def tenant_deleted_at(self, name: str) -> float | None:
        gone = schema.deleted_tenants
        with self._read() as conn:
            row = conn.execute(select(gone.c.deleted_at).where(gone.c.name == name)).first()
        return None if row is None else float(row[0])

    def assign_uid(self, tenant: str, lowest: int, highest: int, at: float) -> int:
        t = schema.tenant_uids
        for _ in range(5):  # another plane on the same database may take the same number first
            with self._read() as conn:
                live = conn.execute(select(t.c.uid).where(t.c.tenant == tenant, t.c.released_at.is_(None))).first()
                if live is not None:
                    return int(live[0])
                top = conn.execute(select(func.max(t.c.uid))).scalar()
            uid = lowest if top is None else max(lowest, int(top) + 1)
            if uid > highest:
                raise ValueError(f"the tenant uid range {lowest}..{highest} is spent (settings job_uid_min/max)")
            try:
                with self._write() as conn:
                    conn.execute(insert(t).values(uid=uid, tenant=tenant, assigned_at=at, released_at=None))
                return uid
            except IntegrityError:
                continue
        raise StoreUnavailable(f"could not assign a uid to tenant {tenant!r}: the range is contended")

    def release_uid(self, tenant: str, at: float) -> None:
        t = schema.tenant_uids
        with self._write() as conn:
            conn.execute(update(t).where(t.c.tenant == tenant, t.c.released_at.is_(None)).values(released_at=at))

    def live_uid_span(self) -> tuple[int, int] | None:
        t = schema.tenant_uids
        with self._read() as conn:
            row = conn.execute(select(func.min(t.c.uid), func.max(t.c.uid)).where(t.c.released_at.is_(None))).first()
        return None if row is None or row[0] is None else (int(row[0]), int(row[1]))

    # queues -------------------------------------------------------------------------------
    def save_queue(self, queue: QueueRecord) -> None:
        c = queue.config
        values = {
            "name": c.name,
            "cohort": c.cohort,
            "nominal": c.nominal.to_dict(),
            "borrowing_limit": c.borrowing_limit.to_dict(),
            "lending_limit": c.lending_limit.to_dict(),
            "weight": c.weight,
            "preemption": {"reclaim_within_cohort": str(c.reclaim_within_cohort), "within_queue": str(c.within_queue)},
            "created_at": queue.created_at,
            "max_runtime_s": c.max_runtime_s,
        }
        t = schema.queues
        with self._write() as conn:
            if conn.execute(update(t).where(t.c.name == c.name).values(**values)).rowcount == 0:
                conn.execute(insert(t).values(**values))

    def get_queue(self, name: str) -> QueueRecord | None:
        with self._read() as conn:
            row = conn.execute(select(schema.queues).where(schema.queues.c.name == name)).first()
        return _queue_from_row(row) if row else None

    def list_queues(self) -> list[QueueRecord]:
        with self._read() as conn:
            return [_queue_from_row(r) for r in conn.execute(select(schema.queues).order_by(schema.queues.c.name))]

    def delete_queue(self, name: str) -> None:
        with self._write() as conn:
            conn.execute(delete(schema.queue_grants).where(schema.queue_grants.c.queue == name))
            conn.execute(delete(schema.queues).where(schema.queues.c.name == name))

    def grant_queue(self, queue: str, tenant: str, granted: bool = True) -> None:
        g = schema.queue_grants
        with self._write() as conn:
            conn.execute(delete(g).where(g.c.queue == queue, g.c.tenant == tenant))
            if granted:
                conn.execute(insert(g).values(queue=queue, tenant=tenant))

    def queue_grants(self) -> dict[str, list[str]]:
        g = schema.queue_grants
        out: dict[str, list[str]] = {}
        with self._read() as conn:
            for r in conn.execute(select(g.c.queue, g.c.tenant).order_by(g.c.queue, g.c.tenant)):
                out.setdefault(r.queue, []).append(r.tenant)
        return out

    # priority classes ---------------------------------------------------------------------
    def save_priority_class(self, pc: PriorityClass) -> None:
        values = {
            "name": pc.name,
            "value": pc.value,
            "description": pc.description,
            "preempts": pc.preempts,
            "is_default": pc.default,
            "created_at": pc.created_at,
        }
        t = schema.priority_classes
        with self._write() as conn:
            if conn.execute(update(t).where(t.c.name == pc.name).values(**values)).rowcount == 0:
                conn.execute(insert(t).values(**values))

    def get_priority_class(self, name: str) -> PriorityClass | None:
        t = schema.priority_classes
        with self._read() as conn:
            row = conn.execute(select(t).where(t.c.name == name)).first()
        return _priority_class_from_row(row) if row else None

    def list_priority_classes(self) -> list[PriorityClass]:
        t = schema.priority_classes
        with self._read() as conn:
            return [_priority_class_from_row(r) for r in conn.execute(select(t).order_by(t.c.name))]

    def delete_priority_class(self, name: str) -> None:
        t = schema.priority_classes
        with self._write() as conn:
            conn.execute(delete(t).where(t.c.name == name))

    # nodes --------------------------------------------------------------------------------
    def save_node(self, node: NodeRecord) -> None:
        values = {
            "name": node.name,
            "health": NodeHealth(node.health).value,
            "reason": node.reason,
            "cordoned_by": node.cordoned_by,
            "updated_at": node.updated_at,
        }
        with self._write() as conn:
            res = conn.execute(update(schema.nodes).where(schema.nodes.c.name == node.name).values(**values))
            if res.rowcount == 0:
                conn.execute(insert(schema.nodes).values(**values))

    def list_nodes(self) -> list[NodeRecord]:
        with self._read() as conn:
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
            with self._write() as conn:
                conn.execute(insert(schema.datasets).values(**self._dataset_values(ds)))
        except IntegrityError:
            raise DuplicateError(f"dataset {ds.tenant}/{ds.name} exists") from None

    def save_dataset(self, ds: DatasetRecord) -> None:
        t = schema.datasets
        with self._write() as conn:
            values = self._dataset_values(ds)
            done = conn.execute(update(t).where(t.c.tenant == ds.tenant, t.c.name == ds.name).values(**values))
            if done.rowcount == 0:
                conn.execute(insert(t).values(**values))

    def get_dataset(self, tenant: str, name: str) -> DatasetRecord | None:
        t = schema.datasets
        with self._read() as conn:
            row = conn.execute(select(t).where(t.c.tenant == tenant, t.c.name == name)).first()
        return self._dataset_from_row(row) if row else None

    def list_datasets(
        self, tenant: str | None = None, after: tuple[str, str] | None = None, limit: int | None = None
    ) -> list[DatasetRecord]:
        t = schema.datasets
        q = select(t).order_by(t.c.tenant, t.c.name)
        if tenant is not None:
            q = q.where(t.c.tenant == tenant)
        if after is not None:
            q = q.where(or_(t.c.tenant > after[0], and_(t.c.tenant == after[0], t.c.name > after[1])))
        if limit:
            q = q.limit(limit)
        with self._read() as conn:
            return [self._dataset_from_row(r) for r in conn.execute(q)]

    def delete_dataset(self, tenant: str, name: str) -> None:
        t = schema.datasets
        with self._write() as conn:
            conn.execute(delete(t).where(t.c.tenant == tenant, t.c.name == name))

    def publish_dataset(self, tenant: str, name: str, at: float) -> None:
        try:
            with self._write() as conn:
                conn.execute(insert(schema.dataset_publications).values(name=name, tenant=tenant, published_at=at))
        except IntegrityError:
            raise DuplicateError(f"a dataset named {name} is already published") from None

    def unpublish_dataset(self, name: str) -> None:
        t = schema.dataset_publications
        with self._write() as conn:
            conn.execute(delete(t).where(t.c.name == name))

    def published_datasets(self) -> dict[str, str]:
        t = schema.dataset_publications
        with self._read() as conn:
            return {r.name: r.tenant for r in conn.execute(select(t.c.name, t.c.tenant))}

    def claim(self, tag: str | None = None) -> None:
        """Hold the database for this control plane until `close` (or the process ends, `kill
        -9` included): StoreInUse if another plane holds it. Two planes on one database — a
        second `sluice up` with another home but the same `db_url` — would each recover the
        other's running jobs as gone and run them again. PostgreSQL: a session-level advisory
        lock on a connection kept open; SQLite: an exclusive `flock` on `<database>.plane-lock`.

        `tag`: the plane's lasting PostgreSQL session tag (server.py `plane_tag`), kept by its
        home across restarts. A session carrying it that holds the lock is then ended as this
        plane's own — a restarted plane's dead predecessor's, lingering at the server after a
        crash or reboot, which refused the restarted plane until the server dropped it. Only a
        caller that proves no other live process has the tag (the home's lock) may give it:
        a live plane's session ended, the two would end each other's in turn."""
        if tag is not None and self._claim is None:
            self._claim_tag = tag
        if self._claim is not None:
            return
        url = make_url(self.url)
        if url.drivername.startswith("sqlite"):
            path = f"{url.database}.plane-lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise StoreInUse(
                    f"another control plane (pid {holder}) uses the database {url.database}; "
                    "one database serves one plane: give this one its own (SLUICE_DATABASE_URL, or another SLUICE_HOME)"
                ) from None
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            self._claim = fd
            return
        self._holds_pg = True
        conn = self._engine.connect()
        try:
            conn.execute(text("SELECT set_config('application_name', :tag, false)"), {"tag": self._claim_tag})
            conn.commit()  # a session setting made in a transaction that rolls back is undone
            got = conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({PLANE_LOCK_KEY})").scalar()
            conn.rollback()  # no transaction left open; a session-level lock outlives it
            if not got:
                got = self._take_from_own_orphan(conn)
        except BaseException:
            with contextlib.suppress(Exception):  # not back to the pool: its session may hold the lock
                conn.invalidate()
                conn.close()
            raise
        if not got:
            conn.close()
            raise StoreInUse(
                f"another control plane is connected to the database {url.render_as_string(hide_password=True)} "
                "and holds it; one database serves one plane: give this one its own (SLUICE_DATABASE_URL)"
            )
        self._claim = conn

    def _take_from_own_orphan(self, conn: Connection, wait_s: float = 10.0) -> bool:
        """Where the lock's holder is this store's own earlier claim session — cut off from
        this process (a network cut: the client saw its connection fail, the server did not)
        or its dead predecessor's (the tag given to `claim`), lingering until the server's
        keepalives give up — end that session and take the lock. Another plane's session never
        carries this store's tag."""
        hi, lo = PLANE_LOCK_KEY >> 32, PLANE_LOCK_KEY & 0xFFFFFFFF
        pid = conn.execute(
            text(
                "SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :hi AND l.objid = :lo "
                "AND l.objsubid = 1 AND a.application_name = :tag AND a.pid <> pg_backend_pid()"
            ),
            {"hi": hi, "lo": lo, "tag": self._claim_tag},
        ).scalar()
        conn.rollback()
        if pid is None:
            return False
        log.warning(
            "the database lock is held by this plane's own earlier session (pid %s, %s), cut off from it "
            "or left by this plane before a restart; ending that session and taking the lock back",
            pid,
            self._claim_tag,
        )
        try:
            # By the tag again in the same statement, not by the pid alone: a pid looked up a
            # moment ago may by now be another plane's new session.
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE pid = :pid AND application_name = :tag AND pid <> pg_backend_pid()"
                ),
                {"pid": pid, "tag": self._claim_tag},
            )
        except DBAPIError as err:
            if err.connection_invalidated:
                raise
            # Refused (a superuser's session, a role this one is no member of): the database
            # is still held, as by another plane.
            conn.rollback()
            log.warning("the database refused to end this plane's earlier session (pid %s): %s", pid, _reason(err))
            return False
        conn.rollback()
        deadline = time.monotonic() + wait_s  # terminating only signals: the lock goes a moment later
        while time.monotonic() < deadline:
            if conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({PLANE_LOCK_KEY})").scalar():
                conn.rollback()
                return True
            conn.rollback()
            time.sleep(0.1)
        return False

    def keep_claim(self) -> None:
        """Check that this plane still holds its database, and take it again where a
        PostgreSQL restart (or a dropped connection) ended the session and the advisory lock
        with it — before, a second plane could then claim the database while the first went
        on running its jobs. After a network cut the old session may live on at the server,
        holding the lock: being this plane's own (its application_name), it is ended and the
        lock taken back, where before the plane read the lock as taken and stopped.
        StoreInUse: another plane took it meanwhile (this one must stop acting on the jobs);
        StoreUnavailable: the server is still gone (try again later).
        SQLite's flock lasts as long as the process: nothing to check."""
        if not self._holds_pg:
            return
        conn = self._claim
        if isinstance(conn, Connection):
            try:
                conn.exec_driver_sql("SELECT 1")
                conn.rollback()
                return
            except DBAPIError:
                with contextlib.suppress(Exception):  # not back to the pool: it may hold the lock
                    conn.invalidate()
                    conn.close()
                self._claim = None
        try:
            self.claim()
        except OperationalError as err:
            raise StoreUnavailable(f"the database cannot be read: {_reason(err)}") from err

    def close(self) -> None:
        claim, self._claim = self._claim, None
        self._holds_pg = False
        if isinstance(claim, int):
            os.close(claim)  # the flock goes with the descriptor
        elif claim is not None:
            with contextlib.suppress(Exception):
                claim.close()  # the advisory lock goes with the session
        self._engine.dispose()
