"""The API the dashboard's charts read (docs/dashboard.md): node KPI histories and the health
monitor's score, datasets' cache counters, round latency and the allocation timeline. Each is
bounded, and each shows a tenant only what it may see."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.api.app import create_app
from sluice.api.metrics import ALLOC_HISTORY, KPI_HISTORY, ROUND_HISTORY, PlaneMetrics
from sluice.control.plane import ControlPlane
from sluice.health.monitor import HealthMonitor, MonitorConfig
from sluice.model import ClusterView, JobProgress, JobView, NodeKPIs, Phase
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import TenantSpec
from sluice.store.sql import SqlStore

from .fake_engine import FakeEngine


@dataclass
class Env:
    plane: ControlPlane
    client: TestClient
    metrics: PlaneMetrics
    who: dict[str, dict[str, str]]
    data: Path


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    data = tmp_path / "data"
    data.mkdir()
    (data / "0.bin").write_bytes(b"x" * 100)
    settings = Settings(home=tmp_path / "home", dataset_roots=[str(data)])
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    admin = plane.authenticate(tokens["admin"])
    for name in ("alice", "bob"):
        _, tokens[name] = plane.create_tenant(admin, TenantSpec(name=name))
    who = {k: {"Authorization": f"Bearer {v}"} for k, v in tokens.items()}
    with TestClient(create_app(plane)) as client:
        yield Env(plane, client, client.app.state.metrics, who, data)  # type: ignore[attr-defined]
    plane.store.close()


def view(env: Env, **jobs: JobView) -> ClusterView:
    real = env.plane.controller.view()
    return ClusterView(now=real.now, nodes=real.nodes, jobs=jobs)


def test_node_kpis_are_a_bounded_history_every_tenant_may_read(env: Env) -> None:
    v = view(env)
    for i in range(KPI_HISTORY + 20):
        kpi = {"cpu_busy_pct": float(i), "mem_used_pct": 5.0, "cpu7_busy_pct": 1.0, "peer_excess_cpu_iowait_pct": 2.0}
        env.metrics.observe(v, [NodeKPIs("n0", float(i), kpi)])
    r = env.client.get("/v1/nodes/n0/kpis", headers=env.who["bob"])
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["samples"]) == KPI_HISTORY  # the oldest 20 were dropped
    assert body["samples"][-1] == {
        "time": KPI_HISTORY + 19.0,
        "values": {"cpu_busy_pct": KPI_HISTORY + 19.0, "mem_used_pct": 5.0, "peer_excess_cpu_iowait_pct": 2.0},
    }
    assert body["monitor"] is None  # no health monitor runs
    assert env.client.get("/v1/nodes/n1/kpis", headers=env.who["alice"]).json()["samples"] == []
    assert env.client.get("/v1/nodes/nope/kpis", headers=env.who["alice"]).status_code == 404
    assert env.client.get("/v1/nodes/n0/kpis").status_code == 401


def test_node_kpis_carry_the_monitor_score_against_its_threshold(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monitor = HealthMonitor(MonitorConfig())
    status = {
        "n0": {"health": "Healthy", "model": True, "score": 3.5, "threshold": 7.25, "alarms": 1, "reason": "x"},
        "n1": {"health": "Healthy", "model": False, "score": float("nan"), "threshold": float("nan"), "alarms": 0},
    }
    monkeypatch.setattr(monitor, "status", lambda: status)
    env.plane.health = monitor
    m0 = env.client.get("/v1/nodes/n0/kpis", headers=env.who["alice"]).json()["monitor"]
    assert (m0["score"], m0["threshold"], m0["alarms"], m0["health"]) == (3.5, 7.25, 1, "Healthy")
    assert "reason" not in m0
    m1 = env.client.get("/v1/nodes/n1/kpis", headers=env.who["alice"]).json()["monitor"]
    assert (m1["score"], m1["threshold"], m1["model"]) == (None, None, False)  # NaN (no model yet) is null


def test_dataset_cache_counters_are_shown_to_their_owner_only(env: Env) -> None:
    r = env.client.post(
        "/v1/datasets?probe=false", json={"name": "imgs", "source": str(env.data)}, headers=env.who["alice"]
    )
    assert r.status_code == 201, r.text
    assert (r.json()["cache_hits"], r.json()["hit_rate"]) == (None, None)
    fresh = env.client.get("/v1/datasets/imgs", headers=env.who["alice"]).json()
    assert (fresh["cache_hits"], fresh["cache_misses"], fresh["hit_rate"]) == ({"memory": 0, "disk": 0}, 0, None)

    job = JobView(id="j1", tenant="alice", name="a", phase=Phase.RUNNING, submitted_at=0, datasets=("alice/imgs",))
    counters = {"cache:alice/imgs:hits_memory": 6.0, "cache:alice/imgs:hits_disk": 2.0, "cache:alice/imgs:misses": 2.0}
    env.metrics.observe(view(env, j1=job), [JobProgress("j1", 1, 0.0, step=1, metrics=counters)])

    [mine] = env.client.get("/v1/datasets", headers=env.who["alice"]).json()["items"]
    assert (mine["cache_hits"], mine["cache_misses"], mine["hit_rate"]) == ({"memory": 6, "disk": 2}, 2, 0.8)
    assert env.client.get("/v1/datasets", headers=env.who["bob"]).json()["items"] == []
    assert env.client.get("/v1/datasets/imgs?tenant=alice", headers=env.who["bob"]).status_code == 404
    admin = env.client.get("/v1/datasets/imgs?tenant=alice", headers=env.who["admin"]).json()
    assert admin["cache_misses"] == 2

    # published, bob may read the dataset, but not its counters (they add up every tenant's reads)
    assert env.client.post("/v1/datasets/imgs/publish?tenant=alice", headers=env.who["admin"]).status_code == 200
    shared = env.client.get("/v1/datasets/imgs", headers=env.who["bob"]).json()
    assert shared["tenant"] == "alice"
    assert (shared["cache_hits"], shared["cache_misses"], shared["hit_rate"]) == (None, None, None)


def test_cluster_stats_round_latency_and_allocation_are_bounded(env: Env) -> None:
    ctl = env.plane.controller
    base = view(env)
    n = max(ROUND_HISTORY, ALLOC_HISTORY) + 50
    for i in range(n):
        ctl.rounds += 1
        ctl.round_seconds = (i % 100) / 1000  # 0 .. 99 ms, over and over
        v = ClusterView(now=1000.0 + 3 * i, nodes=base.nodes, jobs={})
        env.metrics.observe(v, [])
    r = env.client.get("/v1/cluster/stats", headers=env.who["bob"])
    assert r.status_code == 200, r.text
    rounds = r.json()["rounds"]
    assert rounds["count"] == ROUND_HISTORY
    assert rounds["p50"] == pytest.approx(0.05, abs=0.002)
    assert rounds["p95"] == pytest.approx(0.095, abs=0.002)
    assert rounds["max"] == pytest.approx(0.099)
    alloc: list[Any] = r.json()["allocation"]
    assert len(alloc) == ALLOC_HISTORY
    assert alloc[-1] == [1000.0 + 3 * (n - 1), 0.0, 4.0]  # two nodes of 2 cores, nothing requested
    assert env.client.get("/v1/cluster/stats").status_code == 401


def test_allocation_is_sampled_at_most_every_two_seconds(env: Env) -> None:
    env.metrics._alloc.clear()
    base = view(env)
    for t in (0.0, 0.5, 1.9, 2.0, 3.0, 4.1):
        env.metrics.observe(ClusterView(now=t, nodes=base.nodes, jobs={}), [])
    assert [x[0] for x in env.metrics.allocation_history()] == [0.0, 2.0, 4.1]


def test_node_why_names_the_kpis_behind_the_newest_alarm(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sluice node why`: without a monitor the node's own state only; with one, the newest
    counted alarm with each KPI's share, value then and healthy mean and spread."""
    bare = env.client.get("/v1/nodes/n0/why", headers=env.who["alice"]).json()
    assert (bare["health"], bare["monitored"], bare["alarm"]) == ("Healthy", False, None)
    monitor = HealthMonitor(MonitorConfig())
    blame = {"kpi": "node_cpu_other_pct", "share": 0.9, "value": 97.0, "healthy_mean": 0.1, "healthy_spread": 2.0}
    why = {"time": 5.0, "score": 40.0, "threshold": 7.0, "kpis": [blame]}
    status = {"n0": {"health": "Suspect", "score": 40.0, "threshold": 7.0, "alarms": 3, "held": 1, "why": why}}
    monkeypatch.setattr(monitor, "status", lambda: status)
    env.plane.health = monitor
    body = env.client.get("/v1/nodes/n0/why", headers=env.who["alice"]).json()
    assert body["monitored"] and (body["alarms"], body["held"], body["score"]) == (3, 1, 40.0)
    assert body["alarm"]["kpis"] == [blame]
    status["n0"].update(state="learning", healthy_samples=41, train_samples=60, score=float("nan"), scored_at=None)
    body = env.client.get("/v1/nodes/n0/why", headers=env.who["alice"]).json()
    assert (body["state"], body["healthy_samples"], body["train_samples"], body["score"]) == ("learning", 41, 60, None)
    n1 = env.client.get("/v1/nodes/n1/why", headers=env.who["alice"]).json()
    assert n1["monitored"] is False  # the monitor has not seen it
    assert env.client.get("/v1/nodes/nope/why", headers=env.who["alice"]).status_code == 404
    assert env.client.get("/v1/nodes/n0/why").status_code == 401
