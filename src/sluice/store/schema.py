"""The SQL schema of the store and its one-step migration.

The schema is versioned in a `meta` table. A fresh database gets every table at once; an
older one is brought forward by the steps in `MIGRATIONS`, so a control plane upgraded in
place keeps its jobs and event log.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Connection,
    Double,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    delete,
    false,
    func,
    insert,
    inspect,
    select,
    text,
    true,
    update,
)

SCHEMA_VERSION = 8

metadata = MetaData()

# SQLite only makes INTEGER PRIMARY KEY an alias of the rowid (and so autoincrementing);
# PostgreSQL gets a 64-bit identity column so the event log never runs out of numbers.
_SeqType = BigInteger().with_variant(Integer(), "sqlite")

meta = Table(
    "meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant", String(64), nullable=False, index=True),
    Column("name", String(64), nullable=False),
    Column("phase", String(16), nullable=False, index=True),
    Column("spec", JSON, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("submitted_at", Double, nullable=False),
    Column("started_at", Double, nullable=True),
    Column("finished_at", Double, nullable=True),
    Column("attempt", Integer, nullable=False),
    Column("restarts", Integer, nullable=False),
    Column("allocation", JSON, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("checkpoint", Text, nullable=True),
    Column("step", BigInteger, nullable=False),
    Column("loss", Double, nullable=True),
    Column("not_before", Double, nullable=False),
    Column("attained_service", Double, nullable=False),
    # Version 1's free-form state; kept only so old databases need no table rebuild. Always {}.
    Column("extra", JSON, nullable=False, default=dict),
    # Version 2: the job record's typed fields (they lived in `extra` before).
    Column("checkpoint_step", BigInteger, nullable=True),
    Column("stop_intent", JSON, nullable=True),
    Column("requeues", Integer, nullable=False, server_default="0"),
    Column("last_stop_s", Double, nullable=True),
    Column("qoe_met_at", Double, nullable=True),
    # Version 4: seconds run, held against the spec's max_runtime_s.
    Column("run_s", Double, nullable=False, server_default="0"),
    # Version 6: the time run_s is counted up to (JobRecord.run_until), CPU-seconds used.
    Column("run_until", Double, nullable=True),
    Column("cpu_used_s", Double, nullable=False, server_default="0"),
    Column("attempt_cpu_s", Double, nullable=False, server_default="0"),
    # Version 8: what its run folders held at the newest disk check (JobRecord.disk_mb).
    Column("disk_mb", Double, nullable=True),
)
Index("ix_jobs_submitted", jobs.c.submitted_at, jobs.c.id)
ix_jobs_finished = Index("ix_jobs_finished", jobs.c.finished_at)
"""Job retention reads the earliest-finished jobs (`Store.ended_before`)."""

events = Table(
    "events",
    metadata,
    Column("seq", _SeqType, primary_key=True, autoincrement=True),
    Column("time", Double, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("message", Text, nullable=False),
    Column("job_id", String(64), nullable=True, index=True),
    Column("node", String(128), nullable=True, index=True),
    Column("data", JSON, nullable=False),
    sqlite_autoincrement=True,  # never reuse a seq, even after the newest row is gone
)
ix_events_time = Index("ix_events_time", events.c.time)
"""Retention deletes the old events of no job (`Store.delete_events_before`)."""

tenants = Table(
    "tenants",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("admin", Boolean, nullable=False),
    Column("max_running_jobs", Integer, nullable=True),
    Column("weight", Double, nullable=False),
    Column("created_at", Double, nullable=False),
    # Version 3: the highest priority the tenant's jobs may have (None: no cap).
    Column("max_priority", Integer, nullable=True),
    # Version 8: MiB its jobs' run folders may hold (None: no cap).
    Column("max_disk_mb", BigInteger, nullable=True),
)

deleted_tenants = Table(
    "deleted_tenants",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("deleted_at", Double, nullable=False),
)
"""Names of deleted tenants, which are never given to a tenant again: jobs, logs, checkpoints
and datasets are kept under their tenant's name, so a newcomer of the same name would inherit
them. Added by `create_all`; version 3's step fills it from what older versions left behind."""

nodes = Table(
    "nodes",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("health", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("cordoned_by", String(32), nullable=True),
    Column("updated_at", Double, nullable=False),
)

datasets = Table(
    "datasets",
    metadata,
    Column("tenant", String(64), primary_key=True),
    Column("name", String(64), primary_key=True),
    Column("spec", JSON, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("items", BigInteger, nullable=True),
    Column("total_bytes", BigInteger, nullable=True),
)
"""Added after version 1 without a migration step: `create_all` adds the missing table."""

tenant_uids = Table(
    "tenant_uids",
    metadata,
    Column("uid", BigInteger, primary_key=True, autoincrement=False),
    Column("tenant", String(64), nullable=False, index=True),
    Column("assigned_at", Double, nullable=False),
    Column("released_at", Double, nullable=True),
)
"""The unprivileged uid (= gid) each tenant's jobs run as (tenant isolation). A row outlives
its tenant (released_at set), so a uid is never handed to a second tenant: files a deleted
tenant's jobs left behind stay out of a newcomer's reach. A new table: `create_all` adds it to
an older database without a migration step."""

dataset_publications = Table(
    "dataset_publications",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("published_at", Double, nullable=False),
)
"""Datasets an admin published to every tenant (readable by all, deletable by the owner). The
name is the key: a tenant's job mounts a published dataset by name, so two cannot share one.
A new table, so `create_all` adds it to an older database without a migration step."""

queues = Table(
    "queues",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("cohort", String(64), nullable=True),
    Column("nominal", JSON, nullable=False),
    Column("borrowing_limit", JSON, nullable=False),
    Column("lending_limit", JSON, nullable=False),
    Column("weight", Double, nullable=False),
    Column("preemption", JSON, nullable=False, default=dict),
    Column("created_at", Double, nullable=False),
    # Version 4: the most seconds one of its jobs may run.
    Column("max_runtime_s", Double, nullable=True),
)
"""Queues with quotas (docs/queues.md). A new table: `create_all` adds it to an older
database, so it needs no migration step."""

queue_grants = Table(
    "queue_grants",
    metadata,
    Column("queue", String(64), primary_key=True),
    Column("tenant", String(64), primary_key=True),
)
"""Which tenants may submit to which queue (the `default` queue is granted to everyone
without a row). A new table, added by `create_all`."""

priority_classes = Table(
    "priority_classes",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Integer, nullable=False),
    Column("description", String(256), nullable=False, server_default=""),
    Column("preempts", Boolean, nullable=False, server_default=true()),
    Column("is_default", Boolean, nullable=False, server_default=false()),
    Column("created_at", Double, nullable=False),
)
"""Named priority classes (docs/queues.md). A new table, added by `create_all`."""

held_time = Table(
    "held_time",
    metadata,
    Column("tenant", String(64), primary_key=True),
    Column("hour", Double, primary_key=True),
    Column("gpu", Boolean, primary_key=True),
    Column("service_s", Double, nullable=False, server_default="0"),
    Column("run_s", Double, nullable=False, server_default="0"),
    Column("cpu_used_s", Double, nullable=False, server_default="0"),  # version 6
)
"""What each tenant's jobs held, by the hour it was held in (`hour`: its start, Unix seconds),
GPU jobs apart from the others: what `sluice usage --since` sums, so a long job is charged to
the hours it ran in, not whole to the day it was submitted."""
ix_held_time_hour = Index("ix_held_time_hour", held_time.c.hour)
"""Usage retention deletes the oldest hours (`Store.delete_held_time_before`): without it each
batch read the whole table (its key starts with the tenant), 0.08 s of SQLite's write lock a
batch at 1.9M rows (red team s29)."""

Migration = Callable[[Connection], None]


def _v2_typed_job_fields(conn: Connection) -> None:
    """Version 2: a job's stop intent, checkpoint step, requeue count, last stop time and QoE
    time move from the free-form `extra` JSON into typed columns."""
    existing = {c["name"] for c in inspect(conn).get_columns("jobs")}
    for name, ddl in (
        ("checkpoint_step", "BIGINT"),
        ("stop_intent", "JSON"),
        ("requeues", "INTEGER NOT NULL DEFAULT 0"),
        ("last_stop_s", "DOUBLE PRECISION"),
        ("qoe_met_at", "DOUBLE PRECISION"),
    ):
        if name not in existing:
            conn.execute(text(f"ALTER TABLE jobs ADD COLUMN {name} {ddl}"))
    for row in conn.execute(select(jobs.c.id, jobs.c.extra)).all():
        extra = dict(row.extra or {})
        conn.execute(
            update(jobs)
            .where(jobs.c.id == row.id)
            .values(
                checkpoint_step=extra.get("checkpoint_step"),
                stop_intent=extra.get("stop_intent"),
                requeues=int(extra.get("requeues", 0)),
                last_stop_s=extra.get("last_stop_s"),
                qoe_met_at=extra.get("qoe_met_at"),
                extra={},
            )
        )


def _v3_tenant_caps_and_deleted_names(conn: Connection) -> None:
    """Version 3: tenants get `max_priority`; the names of tenants deleted before this version
    (still on their jobs, uids, grants or datasets, but with no tenant row) are recorded as
    deleted, so they are never given to a newcomer, and their queue grants are dropped."""
    existing = {c["name"] for c in inspect(conn).get_columns("tenants")}
    if "max_priority" not in existing:
        conn.execute(text("ALTER TABLE tenants ADD COLUMN max_priority INTEGER"))
    live = {r[0] for r in conn.execute(select(tenants.c.name))}
    named: set[str] = set()
    for column in (
        jobs.c.tenant,
        tenant_uids.c.tenant,
        queue_grants.c.tenant,
        datasets.c.tenant,
        dataset_publications.c.tenant,
    ):
        named.update(r[0] for r in conn.execute(select(column).distinct()))
    recorded = {r[0] for r in conn.execute(select(deleted_tenants.c.name))}
    gone = sorted(named - live - recorded)
    if gone:
        released = dict(
            conn.execute(
                select(tenant_uids.c.tenant, func.max(tenant_uids.c.released_at)).group_by(tenant_uids.c.tenant)
            ).all()
        )
        conn.execute(insert(deleted_tenants), [{"name": n, "deleted_at": float(released.get(n) or 0.0)} for n in gone])
    conn.execute(delete(queue_grants).where(queue_grants.c.tenant.not_in(live)) if live else delete(queue_grants))


def _v4_job_run_time(conn: Connection) -> None:
    """Version 4: a job's seconds run (`run_s`, held against `max_runtime_s`), and a queue's
    `max_runtime_s`. Jobs from before it start at 0: what they ran before is not known."""
    if "run_s" not in {c["name"] for c in inspect(conn).get_columns("jobs")}:
        conn.execute(text("ALTER TABLE jobs ADD COLUMN run_s DOUBLE PRECISION NOT NULL DEFAULT 0"))
    if "max_runtime_s" not in {c["name"] for c in inspect(conn).get_columns("queues")}:
        conn.execute(text("ALTER TABLE queues ADD COLUMN max_runtime_s DOUBLE PRECISION"))


def _v5_held_time_by_hour(conn: Connection) -> None:
    """Version 5: held time by tenant and hour (`held_time`, made by `create_all`). What the
    jobs of an older database held is known only in total: it is put in the hour each job
    started (or was submitted), so `usage` without `--since` is unchanged."""
    if conn.execute(select(func.count()).select_from(held_time)).scalar():
        return
    c = jobs.c
    rows = conn.execute(
        select(c.tenant, c.started_at, c.submitted_at, c.spec, c.attained_service, c.run_s).where(
            (c.attained_service > 0) | (c.run_s > 0)
        )
    )
    sums: dict[tuple[str, float, bool], list[float]] = {}
    for tenant, started, submitted, spec, service, run in rows:
        hour = float(int((started if started is not None else submitted) // 3600) * 3600)
        gpu = bool(((spec or {}).get("resources") or {}).get("gpus") or 0)
        acc = sums.setdefault((str(tenant), hour, gpu), [0.0, 0.0])
        acc[0] += float(service or 0)
        acc[1] += float(run or 0)
    if sums:
        conn.execute(
            insert(held_time),
            [{"tenant": t, "hour": h, "gpu": g, "service_s": s, "run_s": r} for (t, h, g), (s, r) in sums.items()],
        )


def _v6_run_until_and_cpu_used(conn: Connection) -> None:
    """Version 6: the time a job's `run_s` is counted up to (`run_until`), and the CPU-seconds
    jobs used (`cpu_used_s`, by job and in held time). Jobs from before it have no `run_until`:
    a plane restarting under them charges nothing for the time it was down, as before; what
    they used before it is not known (0)."""
    have = {c["name"] for c in inspect(conn).get_columns("jobs")}
    if "run_until" not in have:
        conn.execute(text("ALTER TABLE jobs ADD COLUMN run_until DOUBLE PRECISION"))
    for col in ("cpu_used_s", "attempt_cpu_s"):
        if col not in have:
            conn.execute(text(f"ALTER TABLE jobs ADD COLUMN {col} DOUBLE PRECISION NOT NULL DEFAULT 0"))
    if "cpu_used_s" not in {c["name"] for c in inspect(conn).get_columns("held_time")}:
        conn.execute(text("ALTER TABLE held_time ADD COLUMN cpu_used_s DOUBLE PRECISION NOT NULL DEFAULT 0"))


def _v7_retention_indexes(conn: Connection) -> None:
    """Version 7: indexes job retention reads by (when a job finished, when an event happened);
    `create_all` makes them only with a new table."""
    ix_jobs_finished.create(conn, checkfirst=True)
    ix_events_time.create(conn, checkfirst=True)


def _v8_job_disk(conn: Connection) -> None:
    """Version 8: what a job's run folders held at the newest disk check (`disk_mb`; jobs from
    before it were never reported: null), a tenant's cap on it all (`max_disk_mb`: none), and
    the index usage retention reads the oldest hours of held time by."""
    if "disk_mb" not in {c["name"] for c in inspect(conn).get_columns("jobs")}:
        conn.execute(text("ALTER TABLE jobs ADD COLUMN disk_mb DOUBLE PRECISION"))
    if "max_disk_mb" not in {c["name"] for c in inspect(conn).get_columns("tenants")}:
        conn.execute(text("ALTER TABLE tenants ADD COLUMN max_disk_mb BIGINT"))
    ix_held_time_hour.create(conn, checkfirst=True)  # usage retention reads the oldest hours


MIGRATIONS: dict[int, Migration] = {
    2: _v2_typed_job_fields,
    3: _v3_tenant_caps_and_deleted_names,
    4: _v4_job_run_time,
    5: _v5_held_time_by_hour,
    6: _v6_run_until_and_cpu_used,
    7: _v7_retention_indexes,
    8: _v8_job_disk,
}
"""version -> step that turns a database at version-1 into this version."""


def current_version(conn: Connection) -> int | None:
    row = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).first()
    return int(row[0]) if row else None


def migrate(conn: Connection) -> int:
    """Create missing tables and run pending migration steps; returns the resulting version."""
    metadata.create_all(conn)
    version = current_version(conn)
    if version is None:
        conn.execute(insert(meta).values(key="schema_version", value=str(SCHEMA_VERSION)))
        return SCHEMA_VERSION
    if version > SCHEMA_VERSION:
        raise RuntimeError(
            f"the database is at schema version {version}, newer than this sluice ({SCHEMA_VERSION}); upgrade sluice"
        )
    for step in range(version + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[step](conn)
    if version != SCHEMA_VERSION:
        conn.execute(update(meta).where(meta.c.key == "schema_version").values(value=str(SCHEMA_VERSION)))
    return SCHEMA_VERSION
