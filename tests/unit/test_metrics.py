"""/metrics over a real ControlPlane and the FakeEngine: values match the plane's state, the
finished-job bound holds, and tokens scope what a scrape sees (docs/metrics.md)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from sluice.api.app import create_app
from sluice.api.metrics import DATASET_PRUNE_S, MAX_CACHE_COUNT, PlaneMetrics
from sluice.control.plane import ControlPlane
from sluice.data.index import Index
from sluice.health.monitor import HealthMonitor, MonitorConfig
from sluice.model import ClusterView, JobExited, JobProgress, JobStarted, JobUsage, JobView, NodeKPIs, Phase
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import DatasetSpec, TenantSpec
from sluice.store.base import DatasetRecord
from sluice.store.sql import SqlStore

from .fake_engine import FakeEngine

METRICS_TOKEN = "prom-secret-token"


@dataclass
class Env:
    plane: ControlPlane
    engine: FakeEngine
    client: TestClient
    admin: dict[str, str]
    alice: dict[str, str]
    bob: dict[str, str]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    settings = Settings(home=tmp_path / "home", metrics_token=METRICS_TOKEN, metrics_recent_finished=3)
    engine = FakeEngine()
    plane = ControlPlane(settings, SqlStore(settings.db_url), engine, make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    admin = plane.authenticate(tokens["admin"])
    _, alice = plane.create_tenant(admin, TenantSpec(name="alice"))
    _, bob = plane.create_tenant(admin, TenantSpec(name="bob"))
    with TestClient(create_app(plane)) as client:
        yield Env(plane, engine, client, bearer(tokens["admin"]), bearer(alice), bearer(bob))
    plane.store.close()


JOB = {"name": "mnist", "command": ["python", "train.py"], "resources": {"cpu": {"min": 1, "max": 1}}}


def submit(env: Env, who: dict[str, str]) -> str:
    r = env.client.post("/v1/jobs", json=JOB, headers=who)
    assert r.status_code == 201, r.text
    job_id: str = r.json()["id"]
    return job_id


def start(env: Env, job_id: str) -> int:
    """Place the job (one round) and report it started; its attempt."""
    env.plane.step()
    job = env.plane.controller.book.get(job_id)
    assert job is not None and job.phase == Phase.STARTING, job
    env.engine.pending.append(JobStarted(job_id, job.attempt, "n0", env.engine.now))
    env.plane.step()
    return job.attempt


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(env: Env, who: dict[str, str] | None = None) -> Samples:
    r = env.client.get("/metrics", headers=who or {})
    assert r.status_code == 200, r.text
    out: Samples = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def series(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for n, labels in samples if n == name]


def test_job_node_and_tenant_values_match_the_plane(env: Env) -> None:
    job = submit(env, env.alice)
    attempt = start(env, job)
    now = env.engine.now
    env.engine.pending += [
        JobProgress(job, attempt, now + 1, step=10, loss=2.0),
        JobProgress(job, attempt, now + 3, step=30, loss=1.5),
        JobUsage(job, attempt, now + 3, cpu_cores=0.75),
        NodeKPIs(
            "n0",
            now + 3,
            {"cpu_busy_pct": 42.0, "mem_used_pct": 10.0, "cpu7_busy_pct": 1.0, "gpu1_util_pct": 97.0, "gpu_x": 1.0},
        ),
    ]
    env.plane.step()
    m = scrape(env, env.admin)
    key = {"job_id": job, "tenant": "alice", "queue": "default"}
    rec = env.plane.controller.book.get(job)
    assert rec is not None and rec.allocation is not None
    assert value(m, "sluice_job_info", **key, phase="Running") == 1.0
    assert value(m, "sluice_job_loss", **key) == 1.5
    assert value(m, "sluice_job_step", **key) == 30
    assert value(m, "sluice_job_cpu_used_cores", **key) == 0.75
    assert value(m, "sluice_job_steps_per_second", **key) == pytest.approx(10.0)
    assert value(m, "sluice_job_cpu_request_cores", **key) == rec.allocation.total_cpu_request
    assert value(m, "sluice_job_replicas", **key) == rec.allocation.replicas == 1
    assert value(m, "sluice_job_restarts", **key) == 0
    assert value(m, "sluice_tenant_running_jobs", tenant="alice") == 1
    assert value(m, "sluice_tenant_running_jobs", tenant="bob") == 0
    assert value(m, "sluice_queue_admitted_jobs", queue="default") == 1
    assert value(m, "sluice_queue_usage", queue="default", resource="cores") == 1.0
    # Nodes: one-hot health, and only the fixed KPI list (cpu7_busy_pct is not on it) and the
    # node's GPUs' (gpu_x is no GPU KPI).
    assert value(m, "sluice_node_health", node="n0", state="Healthy") == 1.0
    assert value(m, "sluice_node_health", node="n0", state="Cordoned") == 0.0
    assert value(m, "sluice_node_kpi", node="n0", kpi="cpu_busy_pct") == 42.0
    assert {s["kpi"] for s in series(m, "sluice_node_kpi")} == {"cpu_busy_pct", "mem_used_pct", "gpu1_util_pct"}
    assert value(m, "sluice_node_jobs", node="n0") == 1
    # Decisions by kind and fixed reason class.
    assert value(m, "sluice_decisions_by_reason_total", kind="Place", reason="policy") == 1
    env.client.post("/v1/nodes/n1/cordon", json={"reason": "disk is odd"}, headers=env.admin)
    m = scrape(env)
    assert value(m, "sluice_decisions_by_reason_total", kind="node Cordoned", reason="operator") == 1
    assert value(m, "sluice_node_health", node="n1", state="Cordoned") == 1.0


def test_finished_jobs_are_bounded_to_the_newest(env: Env) -> None:
    jobs = []
    for i in range(5):
        job = submit(env, env.alice)
        attempt = start(env, job)
        env.engine.pending.append(JobExited(job, attempt, env.engine.now + i, 0))
        env.plane.step()
        env.plane.step()  # the round after it finished is where the observer notices
        jobs.append(job)
    live = submit(env, env.alice)
    m = scrape(env, env.admin)
    shown = {s["job_id"]: s["phase"] for s in series(m, "sluice_job_info")}
    assert shown == {**dict.fromkeys(jobs[-3:], "Succeeded"), live: "Pending"}  # metrics_recent_finished=3
    key = {"job_id": jobs[-1], "tenant": "alice", "queue": "default"}
    assert value(m, "sluice_job_cpu_used_cores", **key) == 0.0
    assert value(m, "sluice_job_replicas", **key) == 0


def test_a_waiting_job_shows_one_series_until_it_has_progress(env: Env) -> None:
    """Nine series per unfinished job: a tenant could keep 10,000 jobs queued
    (max_unfinished_jobs_per_tenant) and put 90,000 series, all reading 0, into every scrape.
    A waiting job now shows its info; a suspended one its progress as well (opswalk s31)."""
    waiting = [submit(env, env.alice) for _ in range(3)]
    m = scrape(env, env.admin)
    for job in waiting:
        assert [n for n, labels in m if ("job_id", job) in labels] == ["sluice_job_info"]
    job = waiting[0]
    attempt = start(env, job)
    env.engine.pending.append(JobProgress(job, attempt, env.engine.now + 1, step=12, loss=0.5))
    env.plane.step()
    assert env.client.post(f"/v1/jobs/{job}/suspend", headers=env.alice).status_code == 200
    env.plane.step()
    env.engine.pending.append(JobExited(job, attempt, env.engine.now + 2, -15))  # the stop it asked for
    env.plane.step()
    rec = env.plane.controller.book.get(job)
    assert rec is not None and rec.phase == Phase.SUSPENDED, rec
    m = scrape(env, env.admin)
    key = {"job_id": job, "tenant": "alice", "queue": "default"}
    shown = sorted(n for n, labels in m if ("job_id", job) in labels)
    assert shown == ["sluice_job_info", "sluice_job_loss", "sluice_job_restarts", "sluice_job_step"], shown
    assert value(m, "sluice_job_step", **key) == 12 and value(m, "sluice_job_loss", **key) == 0.5


def test_tokens_scope_what_a_scrape_sees(env: Env) -> None:
    mine = submit(env, env.alice)
    start(env, mine)
    theirs = submit(env, env.bob)
    public = env.client.get("/metrics").text
    assert "sluice_jobs{" in public and "sluice_node_health{" in public
    assert mine not in public and theirs not in public and "alice" not in public and "sluice_job_" not in public

    for who in (env.admin, bearer(METRICS_TOKEN)):
        jobs = {s["job_id"] for s in series(scrape(env, who), "sluice_job_info")}
        assert jobs == {mine, theirs}

    alice = scrape(env, env.alice)
    text = env.client.get("/metrics", headers=env.alice).text
    assert {s["job_id"] for s in series(alice, "sluice_job_info")} == {mine}
    assert {s["tenant"] for s in series(alice, "sluice_tenant_running_jobs")} == {"alice"}
    assert theirs not in text and "bob" not in text

    for bad in ({"Authorization": "Bearer slc_wrong"}, {"Authorization": "Basic YWxpY2U6eA=="}):
        assert env.client.get("/metrics", headers=bad).status_code == 401


def test_dataset_cache_counters_are_summed_per_dataset_and_scoped(env: Env) -> None:
    metrics: PlaneMetrics = env.client.app.state.metrics  # type: ignore[attr-defined]
    for tenant, name in (("alice", "imgs"), ("bob", "text")):
        env.plane.store.create_dataset(DatasetRecord(tenant, name, DatasetSpec(name=name, source="/data/x")))
    view = ClusterView(
        now=0.0,
        nodes={},
        jobs={
            "j1": JobView(
                id="j1", tenant="alice", name="a", phase=Phase.RUNNING, submitted_at=0, datasets=("alice/imgs",)
            ),
            "j2": JobView(id="j2", tenant="bob", name="b", phase=Phase.RUNNING, submitted_at=0, datasets=("bob/text",)),
        },
    )

    def report(job: str, attempt: int, ds: str, hits: float, misses: float) -> JobProgress:
        extra: dict[str, Any] = {f"cache:{ds}:hits_memory": hits, f"cache:{ds}:misses": misses}
        return JobProgress(job, attempt, 0.0, step=1, metrics=extra)

    metrics.observe(view, [report("j1", 1, "alice/imgs", 5, 2), report("j1", 1, "alice/imgs", 8, 2)])
    metrics.observe(view, [report("j1", 2, "alice/imgs", 1, 1)])  # a new attempt counts from 0
    # bob's job reporting counters for alice's dataset (which it does not mount) is ignored
    metrics.observe(view, [report("j2", 1, "bob/text", 4, 0), report("j2", 1, "alice/imgs", 100, 100)])
    m = scrape(env, env.admin)
    assert value(m, "sluice_dataset_cache_hits_total", dataset="alice/imgs", tier="memory") == 9
    assert value(m, "sluice_dataset_cache_misses_total", dataset="alice/imgs") == 3
    assert value(m, "sluice_dataset_cache_hits_total", dataset="bob/text", tier="memory") == 4
    bob = scrape(env, env.bob)
    assert {s["dataset"] for s in series(bob, "sluice_dataset_cache_hits_total")} == {"bob/text"}

    # A deleted dataset's counters go within DATASET_PRUNE_S: a tenant that made, read and
    # deleted datasets in a loop grew /metrics and the plane without end (ops walk s31).
    env.plane.store.delete_dataset("alice", "imgs")
    metrics.observe(view, [])
    assert value(scrape(env, env.admin), "sluice_dataset_cache_misses_total", dataset="alice/imgs") == 3  # not yet
    later = ClusterView(now=DATASET_PRUNE_S + 1.0, nodes={}, jobs=view.jobs)
    metrics.observe(later, [])
    m = scrape(env, env.admin)
    assert {s["dataset"] for s in series(m, "sluice_dataset_cache_hits_total")} == {"bob/text"}
    assert not series(m, "sluice_dataset_cache_misses_total") or {
        s["dataset"] for s in series(m, "sluice_dataset_cache_misses_total")
    } == {"bob/text"}


def test_index_bytes_by_tier(tmp_path: Path) -> None:
    index = Index(str(tmp_path / "index.sqlite"), 0.001)
    index.register("alice~imgs-1", "alice/imgs", "s3://b/imgs", 3, 300)
    index.set_capacity("memory", 10_000)
    index.set_capacity("disk", 10_000)
    index.add_many(
        [
            ("alice~imgs-1", "k1", "memory", 100, 0, 0.1),
            ("alice~imgs-1", "k2", "disk", 100, 0, 0.1),
            ("alice~imgs-1", "k3", "disk", 50, 0, 0.1),
        ]
    )
    assert index.bytes_by_tier() == {("alice/imgs", "memory"): 100, ("alice/imgs", "disk"): 150}


def test_anomaly_score_and_threshold_where_the_health_monitor_runs(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "sluice_node_anomaly_score" not in env.client.get("/metrics").text  # no monitor: no series
    monitor = HealthMonitor(MonitorConfig())
    status = {"n0": {"score": 3.5, "threshold": 7.25}, "n1": {"score": float("nan"), "threshold": float("nan")}}
    monkeypatch.setattr(monitor, "status", lambda: status)
    env.plane.health = monitor
    m = scrape(env)
    assert value(m, "sluice_node_anomaly_score", node="n0") == 3.5
    assert value(m, "sluice_node_anomaly_threshold", node="n0") == 7.25
    assert series(m, "sluice_node_anomaly_score") == [{"node": "n0"}]  # no model yet: no sample, not NaN


def test_every_series_is_documented(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monitor = HealthMonitor(MonitorConfig())
    monkeypatch.setattr(monitor, "status", lambda: {"n0": {"score": 1.0, "threshold": 2.0}})
    env.plane.health = monitor
    text = env.client.get("/metrics", headers=env.admin).text
    families = set(re.findall(r"^# TYPE (sluice_[a-z_]+) (\w+)", text, re.M))
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert len(families) > 30
    for name, kind in families:
        if name.endswith("_created"):  # prometheus_client's own creation time of the histogram
            continue
        documented = name if kind != "counter" else f"{name.removesuffix('_total')}_total"
        assert f"`{documented}`" in docs, f"{documented} is not in docs/metrics.md"


def test_a_deleted_job_leaves_the_finished_jobs_series(env: Env) -> None:
    """`sluice job delete` forgets a job for good: its series (id, tenant, phase, loss, step)
    stayed among the newest finished jobs', scraped until newer ones pushed it out."""
    job = submit(env, env.alice)
    attempt = start(env, job)
    env.engine.pending.append(JobExited(job, attempt, env.engine.now, 0))
    env.plane.step()
    env.plane.step()
    assert {s["job_id"] for s in series(scrape(env, env.alice), "sluice_job_info")} == {job}
    assert env.client.delete(f"/v1/jobs/{job}", headers=env.alice).status_code == 200
    for who in (env.alice, env.admin):
        assert series(scrape(env, who), "sluice_job_info") == []


def test_a_metrics_token_too_short_to_be_a_secret_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`SLUICE_METRICS_TOKEN=a` was taken, and it reads every tenant's series (ops walk s31)."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="metrics_token"):
        Settings(home=tmp_path / "home", metrics_token="a")
    from sluice.settings import SettingsError, load_settings

    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLUICE_METRICS_TOKEN", "short-secret")
    with pytest.raises(SettingsError, match="SLUICE_METRICS_TOKEN") as err:
        load_settings()
    assert "short-secret" not in str(err.value)  # a secret is not repeated
    assert Settings(home=tmp_path / "home", metrics_token="x" * 16).metrics_token == "x" * 16


def test_absurd_cache_counters_cannot_break_the_scrape(env: Env) -> None:
    """A job reports its own cache counters. Two reports of 1e308 (two attempts, or two jobs
    on one dataset) summed past a float's range, and every scrape that saw the dataset (the
    admin's and the metrics token's: all of Prometheus) failed with an OverflowError (sdkwalk,
    s32). A counter is bounded: a report past MAX_CACHE_COUNT is not a count, and the total
    stops at it."""
    metrics: PlaneMetrics = env.client.app.state.metrics  # type: ignore[attr-defined]
    env.plane.store.create_dataset(DatasetRecord("alice", "imgs", DatasetSpec(name="imgs", source="/data/x")))
    j1 = JobView(id="j1", tenant="alice", name="a", phase=Phase.RUNNING, submitted_at=0, datasets=("alice/imgs",))
    view = ClusterView(now=0.0, nodes={}, jobs={"j1": j1})

    def report(attempt: int, hits: float) -> JobProgress:
        return JobProgress("j1", attempt, 0.0, step=1, metrics={"cache:alice/imgs:hits_memory": hits})

    metrics.observe(view, [report(1, 5), report(1, 1e308), report(2, 1e308)])
    assert value(scrape(env, env.admin), "sluice_dataset_cache_hits_total", dataset="alice/imgs", tier="memory") == 5
    for attempt in range(3, 8):
        metrics.observe(view, [report(attempt, MAX_CACHE_COUNT)])
    m = scrape(env, bearer(METRICS_TOKEN))
    assert value(m, "sluice_dataset_cache_hits_total", dataset="alice/imgs", tier="memory") == MAX_CACHE_COUNT
