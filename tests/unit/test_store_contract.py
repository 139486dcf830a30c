"""The Store contract, checked on SqlStore over SQLite (here) and PostgreSQL
(tests/integration/test_postgres_store.py reuses `StoreContract` against a real server)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sluice.model import Allocation, Assignment, JobRecord, NodeHealth, Phase, StopIntent, StopKind
from sluice.model.queue import Limits, PriorityClass, QueueConfig, Reclaim, WithinQueue
from sluice.spec import DatasetSpec, JobSpec
from sluice.spec.job import Resources
from sluice.store import DuplicateError, NewEvent, NodeRecord, TenantRecord
from sluice.store.base import DatasetRecord, HeldTime, QueueRecord, Store, UsageRow
from sluice.store.memory import MemoryStore
from sluice.store.schema import SCHEMA_VERSION
from sluice.store.sql import SqlStore


def make_job(job_id: str, tenant: str = "alice", submitted_at: float = 1.0) -> JobRecord:
    spec = JobSpec.model_validate(
        {
            "name": "train-mnist",
            "command": ["python", "train.py", "--lr", "0.1"],
            "env": {"SEED": "7"},
            "resources": {"cpu": {"min": 0.5, "max": 2}, "memory_mb": 512},
            "qoe": {"loss": 0.25, "deadline_s": 600},
            "labels": {"team": "vision"},
        }
    )
    return JobRecord(id=job_id, tenant=tenant, spec=spec, submitted_at=submitted_at)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_paging(store: Store) -> None:
    """Keyset pagination: walking pages with `after` = the last key seen yields every
    record once, in order, even where sort keys tie (same submitted_at)."""
    for i, t in enumerate([3.0, 1.0, 2.0, 2.0, 2.0, 5.0]):
        store.create_job(make_job(f"j{i}", submitted_at=t, tenant="alice" if i % 2 else "bob"))
    every = [j.id for j in store.list_jobs()]
    seen: list[str] = []
    after: tuple[float, str] | None = None
    while page := store.list_jobs(limit=2, after=after):
        seen += [j.id for j in page]
        after = (page[-1].submitted_at, page[-1].id)
    assert seen == every and len(every) == 6
    assert [j.id for j in store.list_jobs(tenant="alice", after=(2.0, "j2"))] == ["j3", "j5"]
    for i in range(5):
        store.append_event(float(i), "decision", f"e{i}", job_id="j0")
    first = store.events(job_id="j0", limit=2)
    assert [e.message for e in first] == ["e0", "e1"]
    assert [e.message for e in store.events(job_id="j0", since_seq=first[-1].seq, limit=2)] == ["e2", "e3"]
    for name in ["carol", "alice", "bob"]:
        store.create_tenant(TenantRecord(name, hash_token(name)))
    assert [t.name for t in store.list_tenants(limit=2)] == ["alice", "bob"]
    assert [t.name for t in store.list_tenants(after="bob", limit=2)] == ["carol"]
    for owner, name in [("bob", "b"), ("alice", "z"), ("alice", "a")]:
        store.create_dataset(DatasetRecord(owner, name, DatasetSpec(name=name, source="/data")))
    assert [(d.tenant, d.name) for d in store.list_datasets(after=("alice", "a"), limit=2)] == [
        ("alice", "z"),
        ("bob", "b"),
    ]
    assert [d.name for d in store.list_datasets(tenant="alice", after=("alice", "a"))] == ["z"]


def check_usage(store: Store) -> None:
    """An accounting report's groups: by tenant, phase and GPU use, summed in the store (one
    grouped read), limited to a tenant and to jobs submitted since a time."""
    gpu_spec = make_job("x").spec.model_copy(update={"resources": Resources(gpus=2)})
    jobs = [
        replace(make_job("a1", "alice", 1.0), phase=Phase.SUCCEEDED, attained_service=100.0, run_s=50.0, restarts=1),
        replace(make_job("a2", "alice", 2.0), phase=Phase.SUCCEEDED, attained_service=20.0, run_s=10.0),
        replace(make_job("a3", "alice", 3.0), spec=gpu_spec, phase=Phase.FAILED, attained_service=7200.0, run_s=3600.0),
        replace(make_job("b1", "bob", 4.0), phase=Phase.RUNNING, attained_service=5.0, run_s=5.0, restarts=2),
    ]
    for j in jobs:
        store.create_job(j)
    assert store.job_usage() == [
        UsageRow("alice", "Failed", True, 1, 7200.0, 3600.0, 0),
        UsageRow("alice", "Succeeded", False, 2, 120.0, 60.0, 1),
        UsageRow("bob", "Running", False, 1, 5.0, 5.0, 2),
    ]
    assert store.job_usage(tenant="bob") == [UsageRow("bob", "Running", False, 1, 5.0, 5.0, 2)]
    assert store.job_usage(tenant="alice", since=2.0) == [
        UsageRow("alice", "Failed", True, 1, 7200.0, 3600.0, 0),
        UsageRow("alice", "Succeeded", False, 1, 20.0, 10.0, 0),
    ]
    assert store.job_usage(since=10.0) == [] and store.job_usage(tenant="nobody") == []


def check_held_time(store: Store) -> None:
    """Held time by tenant and hour: rows add to their (tenant, hour, gpu) total, and a window
    sums the hours from the one `since` falls in, per tenant and GPU use."""
    h0, h1 = 36_000.0, 39_600.0
    store.add_held_time([HeldTime("alice", h0, False, 100, 50), HeldTime("alice", h0, True, 20, 10)])
    store.add_held_time([HeldTime("bob", h1, False, 5, 5)])
    store.add_held_time([HeldTime("alice", h0, False, 1, 1), HeldTime("alice", h1, False, 2, 2)])
    store.add_held_time([])
    # CPU-seconds used add up the same way (rows above used none)
    store.add_held_time([HeldTime("alice", h0, True, 0, 0, 7.5), HeldTime("alice", h0, True, 0, 0, 0.5)])
    assert store.held_time(tenant="alice") == [
        HeldTime("alice", 0.0, False, 103, 53),
        HeldTime("alice", 0.0, True, 20, 10, 8.0),
    ]
    store.add_held_time([HeldTime("alice", h0, True, 0, 0, -8.0)])  # back to none, for the checks below
    assert store.held_time() == [
        HeldTime("alice", 0.0, False, 103, 53),
        HeldTime("alice", 0.0, True, 20, 10),
        HeldTime("bob", 0.0, False, 5, 5),
    ]
    assert store.held_time(since=h1 + 59) == [HeldTime("alice", h1, False, 2, 2), HeldTime("bob", h1, False, 5, 5)]
    assert store.held_time(tenant="bob", since=h0) == [HeldTime("bob", h0, False, 5, 5)]
    assert store.held_time(since=h1 + 3600) == [] and store.held_time(tenant="nobody") == []
    # usage retention: the oldest whole hours ended by `before` go, each hour whole
    h2 = h1 + 3600
    store.add_held_time([HeldTime(t, h2, False, 1, 1) for t in ("alice", "bob", "carol")])
    assert store.delete_held_time_before(h1 + 3599, 10) == 2  # h0 ended; h1 had not
    assert store.held_time(since=0) == [
        HeldTime("alice", 0.0, False, 3, 3),
        HeldTime("bob", 0.0, False, 6, 6),
        HeldTime("carol", 0.0, False, 1, 1),
    ]
    assert store.delete_held_time_before(h2 + 3600, 1) == 2  # the limit reached in h1: all of h1
    assert store.delete_held_time_before(h2 + 3600, 0) == 0
    assert store.delete_held_time_before(h2 + 3600, 100) == 3
    assert store.held_time() == [] and store.delete_held_time_before(h2 + 7200, 100) == 0


def rewind(db: Path, version: int, *statements: str) -> None:
    """Make the SQLite database at `db` look as schema `version` left it: run `statements`
    (dropping what later versions added) and set its recorded version."""
    import sqlite3

    with sqlite3.connect(db) as con:
        for statement in statements:
            con.execute(statement)
        con.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(version),))
    con.close()


def check_deleted_tenant(store: Store) -> None:
    """A deleted tenant's name is never given out again (its jobs, datasets and uid keep the
    name, so a newcomer would inherit them), and its queue grants go with it."""
    store.create_tenant(TenantRecord("carol", hash_token("c")))
    store.create_tenant(TenantRecord("bob", hash_token("b")))
    for tenant in ("carol", "bob"):
        store.grant_queue("research", tenant)
    store.grant_queue("ml", "carol")
    assert store.tenant_deleted_at("carol") is None
    store.delete_tenant("carol", 7.5)
    assert store.get_tenant("carol") is None
    assert store.tenant_deleted_at("carol") == 7.5 and store.tenant_deleted_at("bob") is None
    assert store.queue_grants() == {"research": ["bob"]}
    with pytest.raises(DuplicateError, match="deleted tenant"):
        store.create_tenant(TenantRecord("carol", hash_token("new")))
    with pytest.raises(DuplicateError, match="deleted tenant"):
        store.save_tenant(TenantRecord("carol", hash_token("new")))
    assert store.get_tenant("carol") is None and store.tenant_by_token_hash(hash_token("new")) is None
    store.delete_tenant("carol", 9.0)  # again: the first time is kept
    assert store.tenant_deleted_at("carol") == 7.5


def check_ended_disk(store: Store) -> None:
    """A tenant's ended jobs' disk use (its `max_disk_mb`): their last measured `disk_mb`,
    summed per tenant asked for; live and never-measured jobs and other tenants left out."""
    rows = [
        ("a1", "alice", Phase.SUCCEEDED, 10.5),
        ("a2", "alice", Phase.FAILED, 2.0),
        ("a3", "alice", Phase.RUNNING, 100.0),
        ("a4", "alice", Phase.CANCELLED, None),
        ("b1", "bob", Phase.SUCCEEDED, 7.0),
        ("c1", "carol", Phase.SUCCEEDED, 3.0),
    ]
    for job_id, tenant, phase, mb in rows:
        store.create_job(replace(make_job(job_id, tenant), phase=phase, disk_mb=mb))
    assert store.ended_disk_mb(["alice", "bob", "dave"]) == {"alice": 12.5, "bob": 7.0}
    assert store.ended_disk_mb([]) == {}
    many = [f"t{i}" for i in range(600)] + ["carol"]  # past one IN's bound
    assert store.ended_disk_mb(many) == {"carol": 3.0}
    tenant = TenantRecord("erin", hash_token("e"), max_disk_mb=4096)
    store.create_tenant(tenant)
    assert store.get_tenant("erin") == tenant


def check_retention(store: Store) -> None:
    """What job retention reads and deletes: ended jobs by when they finished (never a live
    one, however old), a job's events with it, and the old events of no job, oldest first."""
    ended = {"old-ok": (Phase.SUCCEEDED, 10.0), "old-fail": (Phase.FAILED, 20.0), "new": (Phase.CANCELLED, 500.0)}
    for job_id, (phase, at) in ended.items():
        store.create_job(replace(make_job(job_id), phase=phase, finished_at=at))
    store.create_job(replace(make_job("running"), phase=Phase.RUNNING, started_at=1.0))
    store.create_job(replace(make_job("pending"), phase=Phase.PENDING))
    for job_id in ("old-ok", "running", "new"):
        store.append_event(5.0, "phase", f"{job_id} moved", job_id=job_id, node="n0")
    for t in (1.0, 2.0, 3.0, 600.0):
        store.append_event(t, "health", f"node at {t}", node="n0")
    assert [j.id for j in store.ended_before(100.0, 10)] == ["old-ok", "old-fail"]
    assert [j.id for j in store.ended_before(100.0, 1)] == ["old-ok"]
    assert [j.id for j in store.ended_before(100.0, 10, after=(10.0, "old-ok"))] == ["old-fail"]
    assert [j.id for j in store.ended_before(10.0, 10)] == []  # strictly before
    assert store.delete_jobs(["old-ok", "old-ok", "no-such-job"]) == 1
    assert store.get_job("old-ok") is None and store.events(job_id="old-ok") == []
    assert [e.message for e in store.events(job_id="running")] == ["running moved"]
    assert store.delete_jobs([]) == 0
    last = store.events()[-1].seq
    assert store.delete_events_before(100.0, 2) == 2  # the two oldest of no job
    left = ["running moved", "new moved", "node at 3.0", "node at 600.0"]
    assert [e.message for e in store.events(node="n0")] == left
    assert store.delete_events_before(100.0, 10) == 1
    store.append_event(700.0, "health", "after", node="n0")
    assert store.events()[-1].seq > last  # no seq is given out twice
    assert sorted(j.id for j in store.list_jobs()) == ["new", "old-fail", "pending", "running"]
    many = ["new", "no-such-job", "running", *(f"x{i}" for i in range(600))]  # past one IN's bound
    assert store.job_phases(many) == {"new": Phase.CANCELLED, "running": Phase.RUNNING}


class StoreContract:
    """Checks every Store must pass; subclasses provide the `store` fixture."""

    def test_job_round_trips_exactly(self, store: SqlStore) -> None:
        target = Allocation((Assignment("n2", 2.0, None, 0),))
        job = replace(
            make_job("j1"),
            phase=Phase.STOPPING,
            reason="placed on n0: most free CPU",
            started_at=2.5,
            attempt=3,
            restarts=2,
            allocation=Allocation((Assignment("n0", 1.5, 2.0, 0), Assignment("n1", 0.25, None, 1))),
            exit_code=-15,
            checkpoint="/tmp/ck/step-40",
            checkpoint_step=40,
            step=40,
            loss=0.123456789012345,
            not_before=9.75,
            attained_service=123.5,
            stop_intent=StopIntent(StopKind.MIGRATE, "faster node", target, asked_at=7.5),
            requeues=4,
            last_stop_s=1.25,
            qoe_met_at=99.5,
            run_s=61.5,
            run_until=101.25,
            cpu_used_s=88.25,
            attempt_cpu_s=12.5,
        )
        store.create_job(job)
        assert store.get_job("j1") == job

    def test_queue_round_trips_exactly(self, store: SqlStore) -> None:
        config = QueueConfig(
            "research",
            cohort="lab",
            nominal=Limits(cores=8.5, gpus=4, jobs=10),
            borrowing_limit=Limits(cores=2),
            lending_limit=Limits(gpus=1),
            weight=2.5,
            reclaim_within_cohort=Reclaim.LOWER_PRIORITY,
            within_queue=WithinQueue.NEVER,
            max_runtime_s=7200.0,
        )
        store.save_queue(QueueRecord(config, 12.5))
        assert store.get_queue("research") == QueueRecord(config, 12.5)
        store.save_queue(QueueRecord(replace(config, reclaim_within_cohort=Reclaim.NEVER), 12.5))
        got = store.get_queue("research")
        assert got is not None and got.config.reclaim_within_cohort == Reclaim.NEVER

    def test_priority_class_round_trips_exactly(self, store: SqlStore) -> None:
        high = PriorityClass("high", 100, "production training", preempts=True, default=False, created_at=3.5)
        low = PriorityClass("low", -5, "", preempts=False, default=True, created_at=4.0)
        store.save_priority_class(high)
        store.save_priority_class(low)
        assert store.get_priority_class("high") == high
        assert store.list_priority_classes() == [high, low]
        store.save_priority_class(replace(low, default=False, description="batch"))
        assert store.get_priority_class("low") == replace(low, default=False, description="batch")
        store.delete_priority_class("high")
        assert store.get_priority_class("high") is None
        assert [p.name for p in store.list_priority_classes()] == ["low"]
        job = make_job("j-pc")
        job = replace(job, spec=job.spec.model_copy(update={"priority": -5, "priority_class": "low"}))
        store.create_job(job)
        got = store.get_job("j-pc")
        assert got is not None and (got.spec.priority, got.spec.priority_class) == (-5, "low")

    def test_save_job_updates_with_its_events(self, store: SqlStore) -> None:
        job = make_job("j1")
        store.create_job(job, [NewEvent(1.0, "phase", "Pending: submitted", job_id="j1")])
        store.save_job(
            replace(job, phase=Phase.QUEUED, reason="admitted"),
            [NewEvent(2.0, "phase", "Pending -> Queued: admitted", job_id="j1", data={"to": "Queued"})],
        )
        got = store.get_job("j1")
        assert got is not None and got.phase == Phase.QUEUED and got.reason == "admitted"
        assert [e.message for e in store.events(job_id="j1")] == ["Pending: submitted", "Pending -> Queued: admitted"]
        assert store.count_jobs() == {"Queued": 1}

    def test_duplicate_job_is_refused(self, store: SqlStore) -> None:
        store.create_job(make_job("j1"))
        with pytest.raises(DuplicateError):
            store.create_job(make_job("j1"))

    def test_missing_job_is_none(self, store: SqlStore) -> None:
        assert store.get_job("nope") is None

    def test_list_jobs_filters_by_tenant_and_phase_in_submit_order(self, store: SqlStore) -> None:
        for i, (tenant, phase) in enumerate(
            [("alice", Phase.QUEUED), ("bob", Phase.QUEUED), ("alice", Phase.SUCCEEDED), ("alice", Phase.QUEUED)]
        ):
            store.create_job(replace(make_job(f"j{i}", tenant=tenant, submitted_at=10.0 - i), phase=phase))
        assert [j.id for j in store.list_jobs()] == ["j3", "j2", "j1", "j0"]
        assert [j.id for j in store.list_jobs(tenant="alice", phases=[Phase.QUEUED])] == ["j3", "j0"]
        assert [j.id for j in store.list_jobs(phases=[Phase.SUCCEEDED, Phase.QUEUED], limit=2)] == ["j3", "j2"]

    def test_events_are_ordered_append_only_and_filterable(self, store: SqlStore) -> None:
        store.append_event(5.0, "phase", "Pending -> Queued", job_id="j1", data={"from": "Pending"})
        store.append_event(1.0, "decision", "resize to 2 cores: growth 0.4", job_id="j1", data={"cpu": 2.0})
        store.append_event(2.0, "cordon", "operator: disk failing", node="n0")
        store.append_event(3.0, "exit", "exit 0", job_id="j2")
        every = store.events()
        seqs = [e.seq for e in every]
        assert seqs == sorted(seqs) and len(set(seqs)) == 4
        # Ordered by when they were appended, not by the time they carry.
        assert [e.message for e in every][:2] == ["Pending -> Queued", "resize to 2 cores: growth 0.4"]
        j1 = store.events(job_id="j1")
        assert [e.kind for e in j1] == ["phase", "decision"]
        assert j1[1].data == {"cpu": 2.0}
        assert [e.kind for e in store.events(node="n0")] == ["cordon"]
        assert [e.kind for e in store.events(kinds=["exit", "cordon"])] == ["cordon", "exit"]
        assert [e.message for e in store.events(since_seq=seqs[2])] == ["exit 0"]

    def test_event_seq_grows_across_concurrent_writers(self, store: SqlStore) -> None:
        def writer(name: str) -> None:
            for i in range(25):
                store.append_event(float(i), "decision", f"{name}-{i}", job_id=name)

        threads = [threading.Thread(target=writer, args=(f"w{k}",)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        every = store.events()
        assert len(every) == 100
        assert len({e.seq for e in every}) == 100
        for k in range(4):  # each writer's own events keep their order
            assert [e.message for e in store.events(job_id=f"w{k}")] == [f"w{k}-{i}" for i in range(25)]

    def test_tenant_found_by_token_hash_only(self, store: SqlStore) -> None:
        token = "s3cret-token"
        store.create_tenant(TenantRecord("alice", hash_token(token), admin=False, max_running_jobs=3, weight=2.0))
        store.create_tenant(TenantRecord("root", hash_token("other"), admin=True))
        found = store.tenant_by_token_hash(hash_token(token))
        assert found is not None and found.name == "alice" and found.max_running_jobs == 3 and found.weight == 2.0
        assert store.tenant_by_token_hash(token) is None  # the raw token is not a key
        assert store.tenant_by_token_hash(hash_token("wrong")) is None
        assert [t.name for t in store.list_tenants()] == ["alice", "root"]
        with pytest.raises(DuplicateError):
            store.create_tenant(TenantRecord("alice", hash_token("x")))
        store.delete_tenant("alice")
        assert store.get_tenant("alice") is None
        assert store.tenant_by_token_hash(hash_token(token)) is None

    def test_deleted_tenant_name_is_retired_with_its_grants(self, store: SqlStore) -> None:
        check_deleted_tenant(store)

    def test_tenant_max_priority_round_trips(self, store: SqlStore) -> None:
        store.create_tenant(TenantRecord("alice", hash_token("a"), max_priority=-5))
        store.create_tenant(TenantRecord("bob", hash_token("b")))
        assert [(t.name, t.max_priority) for t in store.list_tenants()] == [("alice", -5), ("bob", None)]
        store.save_tenant(replace(store.get_tenant("bob"), max_priority=1000))  # type: ignore[type-var]
        store.save_tenant(replace(store.get_tenant("alice"), max_priority=None))  # type: ignore[type-var]
        assert store.get_tenant("bob").max_priority == 1000  # type: ignore[union-attr]
        assert store.get_tenant("alice").max_priority is None  # type: ignore[union-attr]

    def test_nodes_upsert(self, store: SqlStore) -> None:
        store.save_node(NodeRecord("n1", NodeHealth.CORDONED, "operator: bad disk", "operator", 4.0))
        store.save_node(NodeRecord("n0"))
        store.save_node(NodeRecord("n1", NodeHealth.HEALTHY, "", None, 5.0))
        assert store.list_nodes() == [NodeRecord("n0"), NodeRecord("n1", NodeHealth.HEALTHY, "", None, 5.0)]

    def test_lists_page_by_key(self, store: SqlStore) -> None:
        check_paging(store)

    def test_usage_is_summed_by_tenant_phase_and_gpu_use(self, store: SqlStore) -> None:
        check_usage(store)

    def test_held_time_adds_up_by_tenant_and_hour(self, store: SqlStore) -> None:
        check_held_time(store)

    def test_retention_reads_and_deletes_ended_jobs_and_old_node_events(self, store: SqlStore) -> None:
        check_retention(store)

    def test_ended_jobs_disk_is_summed_per_tenant(self, store: SqlStore) -> None:
        check_ended_disk(store)


class TestSqliteStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[SqlStore]:
        s = SqlStore(f"sqlite:///{tmp_path / 'home' / 'sluice.db'}")
        yield s
        s.close()


def test_memory_store_pages_the_same_way() -> None:
    check_paging(MemoryStore())


def test_memory_store_sums_usage_the_same_way() -> None:
    check_usage(MemoryStore())
    check_held_time(MemoryStore())


def test_memory_store_keeps_retention_the_same_way() -> None:
    check_retention(MemoryStore())
    check_ended_disk(MemoryStore())


def test_memory_store_retires_deleted_tenant_names() -> None:
    check_deleted_tenant(MemoryStore())


def test_sqlite_state_survives_reopen_and_uses_wal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sluice.db'}"
    first = SqlStore(url)
    first.create_job(make_job("j1"))
    first.append_event(1.0, "phase", "submitted", job_id="j1")
    first.close()
    again = SqlStore(url)
    try:
        assert again.get_job("j1") == make_job("j1")
        assert [e.message for e in again.events(job_id="j1")] == ["submitted"]
        with again._engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        again.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sluice.db'}"
    SqlStore(url).close()
    import sqlite3

    with sqlite3.connect(tmp_path / "sluice.db") as conn:
        conn.execute("UPDATE meta SET value='999' WHERE key='schema_version'")
    with pytest.raises(RuntimeError, match="newer than this sluice"):
        SqlStore(url)


def test_a_version_1_database_is_migrated_with_its_jobs_typed_fields(tmp_path: Path) -> None:
    """Version 1 kept a job's stop intent, checkpoint step and counters in a free-form JSON
    column; version 2 moves them into typed columns without losing a job."""
    import sqlite3

    db = tmp_path / "v1.db"
    con = sqlite3.connect(db)
    con.executescript(
        """
        CREATE TABLE meta (key VARCHAR(64) PRIMARY KEY, value VARCHAR(256) NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');
        CREATE TABLE jobs (id VARCHAR(64) PRIMARY KEY, tenant VARCHAR(64) NOT NULL, name VARCHAR(64) NOT NULL,
          phase VARCHAR(16) NOT NULL, spec JSON NOT NULL, reason TEXT NOT NULL, submitted_at FLOAT NOT NULL,
          started_at FLOAT, finished_at FLOAT, attempt INTEGER NOT NULL, restarts INTEGER NOT NULL,
          allocation JSON, exit_code INTEGER, checkpoint TEXT, step BIGINT NOT NULL, loss FLOAT,
          not_before FLOAT NOT NULL, attained_service FLOAT NOT NULL, extra JSON NOT NULL);
        """
    )
    spec = make_job("x").spec.model_dump_json()
    extra = (
        '{"stop_intent": {"kind": "cancel", "reason": "cancelled by alice", "target": null, "asked_at": 4.0},'
        ' "checkpoint_step": 30, "requeues": 2, "last_stop_s": 1.5, "qoe_met_at": 8.0}'
    )
    con.execute(
        "INSERT INTO jobs VALUES ('j1','alice','train-mnist','Stopping',?,'cancel',1.0,2.0,NULL,2,0,"
        '\'[{"node": "n0", "cpu_request": 1.0, "cpu_limit": null, "gpus": 0}]\',NULL,\'/ck\',30,0.5,0.0,3.0,?)',
        (spec, extra),
    )
    con.commit()
    con.close()
    store = SqlStore(f"sqlite:///{db}")
    assert store.schema_version == SCHEMA_VERSION
    job = store.get_job("j1")
    assert job is not None and job.phase == Phase.STOPPING
    assert job.stop_intent == StopIntent(StopKind.CANCEL, "cancelled by alice", None, 4.0)
    assert (job.checkpoint_step, job.requeues, job.last_stop_s, job.qoe_met_at) == (30, 2, 1.5, 8.0)
    store.save_job(replace(job, requeues=3))
    assert store.get_job("j1").requeues == 3  # type: ignore[union-attr]
    store.close()


def test_a_version_2_database_gets_tenant_caps_and_its_deleted_tenants_names(tmp_path: Path) -> None:
    """Version 3 adds `max_priority` to tenants and records deleted tenants' names. A tenant
    deleted before it left its name on jobs, uids, grants and datasets with no tenant row:
    the step records those names (so they are never given out again) and drops their grants."""

    db = tmp_path / "v2.db"
    url = f"sqlite:///{db}"
    store = SqlStore(url)
    store.create_tenant(TenantRecord("bob", hash_token("b"), max_running_jobs=2))
    store.create_job(make_job("j1", tenant="carol"))
    store.assign_uid("carol", 1000, 2000, 1.0)
    store.release_uid("carol", 4.0)
    store.assign_uid("bob", 1000, 2000, 2.0)
    store.grant_queue("research", "carol")
    store.grant_queue("research", "bob")
    store.create_dataset(DatasetRecord("erin", "imgs", DatasetSpec(name="imgs", source="/data")))
    store.close()
    rewind(  # as version 2 left it
        db,
        2,
        "DROP TABLE deleted_tenants",
        "ALTER TABLE tenants DROP COLUMN max_priority",
    )

    again = SqlStore(url)
    try:
        assert again.schema_version == SCHEMA_VERSION
        bob = again.get_tenant("bob")
        assert bob is not None and bob.max_running_jobs == 2 and bob.max_priority is None
        assert again.tenant_deleted_at("carol") == 4.0 and again.tenant_deleted_at("erin") == 0.0
        assert again.tenant_deleted_at("bob") is None
        assert again.queue_grants() == {"research": ["bob"]}
        assert again.get_job("j1") == make_job("j1", tenant="carol")
        with pytest.raises(DuplicateError):
            again.create_tenant(TenantRecord("carol", hash_token("new")))
        again.save_tenant(replace(bob, max_priority=10))
        assert again.get_tenant("bob").max_priority == 10  # type: ignore[union-attr]
    finally:
        again.close()


def test_a_version_3_database_gets_the_jobs_run_time_and_the_queues_time_limit(tmp_path: Path) -> None:
    """Version 4 adds `run_s` (seconds run, held against `max_runtime_s`) to jobs and
    `max_runtime_s` to queues: a job from before it starts at 0, a queue has no limit."""

    db = tmp_path / "v3.db"
    url = f"sqlite:///{db}"
    store = SqlStore(url)
    store.create_job(make_job("j1"))
    store.save_queue(QueueRecord(QueueConfig("short"), 1.0))
    store.close()
    rewind(  # as version 3 left it
        db,
        3,
        "ALTER TABLE jobs DROP COLUMN run_s",
        "ALTER TABLE queues DROP COLUMN max_runtime_s",
    )

    again = SqlStore(url)
    try:
        assert again.schema_version == SCHEMA_VERSION == 8
        job = again.get_job("j1")
        assert job is not None and job.run_s == 0.0
        again.save_job(replace(job, run_s=12.5))
        assert again.get_job("j1").run_s == 12.5  # type: ignore[union-attr]
        queue = again.get_queue("short")
        assert queue is not None and queue.config.max_runtime_s is None
        again.save_queue(replace(queue, config=replace(queue.config, max_runtime_s=60.0)))
        assert again.get_queue("short").config.max_runtime_s == 60.0  # type: ignore[union-attr]
    finally:
        again.close()


def test_a_version_4_database_gets_held_time_from_what_its_jobs_held(tmp_path: Path) -> None:
    """Version 5 keeps held time by tenant and hour (`sluice usage --since`). What the jobs of an
    older database held is known only in total: it goes to the hour each job started (or was
    submitted, if it never started), so a report over all time is unchanged."""

    db = tmp_path / "v4.db"
    url = f"sqlite:///{db}"
    store = SqlStore(url)
    ran = replace(make_job("j1", "alice", 100.0), started_at=7300.0, attained_service=90.0, run_s=45.0)
    store.create_job(ran)
    store.create_job(replace(make_job("j2", "alice", 3700.0), attained_service=4.0, run_s=2.0))
    store.create_job(make_job("j3", "bob", 5.0))  # held nothing
    store.close()
    rewind(  # as version 4 left it
        db,
        4,
        "DROP TABLE held_time",
    )

    again = SqlStore(url)
    try:
        assert again.schema_version == SCHEMA_VERSION == 8
        assert again.held_time() == [HeldTime("alice", 0.0, False, 94.0, 47.0)]
        assert again.held_time(since=7200.0) == [HeldTime("alice", 7200.0, False, 90.0, 45.0)]
        assert again.held_time(since=3600.0) == [HeldTime("alice", 3600.0, False, 94.0, 47.0)]
    finally:
        again.close()
    reopened = SqlStore(url)  # the step runs once: the totals are not added again
    try:
        assert reopened.held_time() == [HeldTime("alice", 0.0, False, 94.0, 47.0)]
    finally:
        reopened.close()


def test_a_version_5_database_gets_run_until_and_cpu_used(tmp_path: Path) -> None:
    """Version 6 adds `run_until` (JobRecord.run_until) and the CPU-seconds used, by job and in
    held time: a job from before it has no `run_until`, so a plane restarting under it charges
    nothing for the time it was down, as before; what was used before it is 0 (not known)."""

    db = tmp_path / "v5.db"
    url = f"sqlite:///{db}"
    store = SqlStore(url)
    store.create_job(replace(make_job("j1"), run_s=30.0, run_until=99.0))
    store.add_held_time([HeldTime("alice", 3600.0, False, 10.0, 5.0)])
    store.close()
    rewind(  # as version 5 left it
        db,
        5,
        "ALTER TABLE jobs DROP COLUMN run_until",
        "ALTER TABLE jobs DROP COLUMN cpu_used_s",
        "ALTER TABLE jobs DROP COLUMN attempt_cpu_s",
        "ALTER TABLE held_time DROP COLUMN cpu_used_s",
    )

    again = SqlStore(url)
    try:
        assert again.schema_version == SCHEMA_VERSION == 8
        job = again.get_job("j1")
        assert job is not None and job.run_s == 30.0 and job.run_until is None and job.cpu_used_s == 0.0
        again.save_job(replace(job, run_until=123.5, cpu_used_s=9.0, attempt_cpu_s=9.0))
        assert again.get_job("j1") == replace(job, run_until=123.5, cpu_used_s=9.0, attempt_cpu_s=9.0)
        assert again.held_time() == [HeldTime("alice", 0.0, False, 10.0, 5.0, 0.0)]  # used before: not known
        again.add_held_time([HeldTime("alice", 3600.0, False, 1.0, 1.0, 2.5)])
        assert again.held_time() == [HeldTime("alice", 0.0, False, 11.0, 6.0, 2.5)]
    finally:
        again.close()


def test_a_version_7_database_gets_the_disk_columns_and_its_jobs_read_as_never_measured(tmp_path: Path) -> None:
    """Version 8 keeps what a job's run folders held at the newest disk check (`disk_mb`)."""

    db = tmp_path / "v7.db"
    url = f"sqlite:///{db}"
    store = SqlStore(url)
    store.create_job(make_job("old"))
    store.close()
    rewind(  # as version 7 left it
        db,
        7,
        "ALTER TABLE jobs DROP COLUMN disk_mb",
        "ALTER TABLE tenants DROP COLUMN max_disk_mb",
        "DROP INDEX ix_held_time_hour",
    )
    again = SqlStore(url)
    try:
        assert again.schema_version == SCHEMA_VERSION == 8
        old = again.get_job("old")
        assert old is not None and old.disk_mb is None
        again.save_job(replace(old, disk_mb=12.5))
        assert again.get_job("old").disk_mb == 12.5  # type: ignore[union-attr]
        again.create_tenant(TenantRecord("t", hash_token("t"), max_disk_mb=5))
        assert again.get_tenant("t").max_disk_mb == 5  # type: ignore[union-attr]
        with again._engine.begin() as conn:  # usage retention reads the oldest hours by the index
            plan = conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT hour FROM held_time WHERE hour <= 7200.0 ORDER BY hour LIMIT 1 OFFSET 9"
            ).all()
        assert "ix_held_time_hour" in str(plan), plan
    finally:
        again.close()


def test_a_version_6_database_gets_the_retention_indexes(tmp_path: Path) -> None:
    """Version 7 indexes what retention reads by (when jobs finished, when events happened):
    `create_all` makes indexes only with a new table, so an older database needs the step."""
    import sqlite3

    db = tmp_path / "v6.db"
    url = f"sqlite:///{db}"
    SqlStore(url).close()
    rewind(  # as version 6 left it
        db,
        6,
        "DROP INDEX ix_jobs_finished",
        "DROP INDEX ix_events_time",
    )
    SqlStore(url).close()
    with sqlite3.connect(db) as con:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        version = con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    con.close()
    assert {"ix_jobs_finished", "ix_events_time"} <= names and version == "8"
