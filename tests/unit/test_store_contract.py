"""The Store contract, checked on SqlStore over SQLite (here) and PostgreSQL
(tests/integration/test_postgres_store.py reuses `StoreContract` against a real server)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.model import Allocation, Assignment, JobRecord, NodeHealth, Phase
from sluice.spec import JobSpec
from sluice.store import DuplicateError, NodeRecord, TenantRecord
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


class StoreContract:
    """Checks every Store must pass; subclasses provide the `store` fixture."""

    def test_job_round_trips_exactly(self, store: SqlStore) -> None:
        job = make_job("j1")
        job.phase = Phase.RUNNING
        job.reason = "placed on n0: most free CPU"
        job.started_at = 2.5
        job.attempt = 3
        job.restarts = 2
        job.allocation = Allocation(
            (Assignment("n0", 1.5, 2.0, 0), Assignment("n1", 0.25, None, 1)),
        )
        job.exit_code = -15
        job.checkpoint = "/tmp/ck/step-40"
        job.step = 40
        job.loss = 0.123456789012345
        job.not_before = 9.75
        job.attained_service = 123.5
        job.extra = {"pid": 4242, "hints": {"a": [1, 2.5, "x"]}}
        store.create_job(job)
        assert store.get_job("j1") == job

    def test_save_job_updates_and_get_returns_a_copy(self, store: SqlStore) -> None:
        job = make_job("j1")
        store.create_job(job)
        job.move(Phase.QUEUED, "admitted")
        job.finished_at = None
        store.save_job(job)
        got = store.get_job("j1")
        assert got is not None and got.phase == Phase.QUEUED and got.reason == "admitted"
        got.step = 99
        assert store.get_job("j1").step == 0  # type: ignore[union-attr]

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
            job = make_job(f"j{i}", tenant=tenant, submitted_at=10.0 - i)
            job.phase = phase
            store.create_job(job)
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

    def test_nodes_upsert(self, store: SqlStore) -> None:
        store.save_node(NodeRecord("n1", NodeHealth.CORDONED, "operator: bad disk", "operator", 4.0))
        store.save_node(NodeRecord("n0"))
        store.save_node(NodeRecord("n1", NodeHealth.HEALTHY, "", None, 5.0))
        assert store.list_nodes() == [NodeRecord("n0"), NodeRecord("n1", NodeHealth.HEALTHY, "", None, 5.0)]


class TestSqliteStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[SqlStore]:
        s = SqlStore(f"sqlite:///{tmp_path / 'home' / 'sluice.db'}")
        yield s
        s.close()


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
