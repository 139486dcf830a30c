"""The REST API over a real ControlPlane (SqlStore on tmp_path, kube policy) and the
FakeEngine of tests/unit/fake_engine.py — a fake because these tests are about HTTP, auth and
validation, not processes (the CLI tests run a live server; engine tests run real jobs)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.model import JobExited, JobStarted, Phase
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.store.sql import SqlStore

from .fake_engine import FakeEngine


@dataclass
class LoggingFakeEngine(FakeEngine):
    """FakeEngine whose jobs 'write' logs to files the test fills in."""

    log_dir: Path = Path("/nonexistent")

    def log_path(self, job_id: str) -> str | None:
        return str(self.log_dir / f"{job_id}.log")


@dataclass
class Env:
    plane: ControlPlane
    engine: LoggingFakeEngine
    client: TestClient
    admin: dict[str, str]
    alice: dict[str, str]
    bob: dict[str, str]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    settings = Settings(home=tmp_path / "home", max_body_bytes=64 * 1024)
    engine = LoggingFakeEngine(log_dir=tmp_path)
    plane = ControlPlane(settings, SqlStore(settings.db_url), engine, make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    admin = plane.authenticate(tokens["admin"])
    from sluice.spec import TenantSpec

    _, alice = plane.create_tenant(admin, TenantSpec(name="alice"))
    _, bob = plane.create_tenant(admin, TenantSpec(name="bob"))
    with TestClient(create_app(plane)) as client:
        yield Env(plane, engine, client, bearer(tokens["admin"]), bearer(alice), bearer(bob))
    plane.store.close()


GOOD = {"name": "mnist", "command": ["python", "train.py"], "resources": {"cpu": {"min": 1, "max": 2}}}


def submit(env: Env, who: dict[str, str], body: Any = None) -> dict[str, Any]:
    r = env.client.post("/v1/jobs", json=body or GOOD, headers=who)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def nothing_stored(env: Env) -> bool:
    return env.plane.store.list_jobs() == [] and env.plane.store.events() == []


# --------------------------------------------------------------------------- auth


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer slc_wrong"}, {"Authorization": "Basic YWxpY2U6eA=="}, {"Authorization": "Bearer"}],
    ids=["missing", "wrong", "basic-scheme", "empty"],
)
def test_bad_or_missing_token_is_401(env: Env, headers: dict[str, str]) -> None:
    for method, url in [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/nodes"), ("GET", "/v1/tenants")]:
        r = env.client.request(method, url, headers=headers, json=GOOD if method == "POST" else None)
        assert r.status_code == 401, (method, url, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"] == "unauthorized"
    assert nothing_stored(env)


def test_tenant_routes_are_admin_only(env: Env) -> None:
    assert env.client.get("/v1/tenants", headers=env.alice).status_code == 403
    r = env.client.post("/v1/tenants", json={"name": "mallory", "admin": True}, headers=env.alice)
    assert r.status_code == 403 and r.json()["error"] == "forbidden"
    assert env.client.delete("/v1/tenants/bob", headers=env.alice).status_code == 403
    assert env.plane.store.get_tenant("mallory") is None and env.plane.store.get_tenant("bob") is not None
    assert env.client.post("/v1/nodes/n0/cordon", json={"reason": "x"}, headers=env.alice).status_code == 403


def test_another_tenants_job_is_indistinguishable_from_a_missing_one(env: Env) -> None:
    job = submit(env, env.alice)
    for suffix, method in [("", "GET"), ("/why", "GET"), ("/logs", "GET"), ("/progress", "GET"), ("/cancel", "POST")]:
        theirs = env.client.request(method, f"/v1/jobs/{job['id']}{suffix}", headers=env.bob)
        missing = env.client.request(method, f"/v1/jobs/j-doesnotexist{suffix}", headers=env.bob)
        assert theirs.status_code == missing.status_code == 404, suffix
        assert theirs.json() == {"error": "not found", "detail": f"job {job['id']} not found"}
        assert missing.json() == {"error": "not found", "detail": "job j-doesnotexist not found"}
    assert [j["id"] for j in env.client.get("/v1/jobs", headers=env.bob).json()] == []
    assert env.plane.store.get_job(job["id"]).phase == Phase.PENDING  # bob's cancel did nothing
    assert [j["id"] for j in env.client.get("/v1/jobs", headers=env.admin).json()] == [job["id"]]


def test_submitting_as_another_tenant_is_forbidden(env: Env) -> None:
    r = env.client.post("/v1/jobs", json={**GOOD, "tenant": "bob"}, headers=env.alice)
    assert r.status_code == 403 and "tenant" in r.json()["detail"]
    assert nothing_stored(env)


# --------------------------------------------------------------------------- bad specs


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({**GOOD, "max_restart": 3}, "max_restart", "unknown field"),
        ({**GOOD, "max_restarts": "lots"}, "max_restarts", "integer"),
        ({**GOOD, "resources": {"cpu": {"min": -1}}}, "resources.cpu.min", "greater than 0"),
        ({"name": "x"}, "command", "required field is missing"),
        ({**GOOD, "command": "python train.py; rm -rf /"}, "command", "not a shell string"),
        ({**GOOD, "command": ["sh", "-c", "python train.py"]}, "command", "shell"),
        ({**GOOD, "env": {"SLUICE_HOME": "/"}}, "env", "set by sluice"),
        ([1, 2], "(body)", "valid dictionary"),
    ],
    ids=["unknown-field", "wrong-type", "negative-cpu", "missing-command", "shell-string", "sh-c", "env", "not-a-map"],
)
def test_bad_spec_is_422_naming_the_field_and_stores_nothing(env: Env, body: Any, field: str, words: str) -> None:
    r = env.client.post("/v1/jobs", json=body, headers=env.alice)
    assert r.status_code == 422, r.text
    out = r.json()
    assert out["error"] == "invalid spec"
    assert any(p["field"] == field and words in p["problem"] for p in out["problems"]), out
    assert nothing_stored(env)


def test_malformed_json_is_422_and_stores_nothing(env: Env) -> None:
    r = env.client.post(
        "/v1/jobs", content=b'{"command": ["python"', headers={**env.alice, "Content-Type": "application/json"}
    )
    assert r.status_code == 422
    assert "not valid JSON" in r.json()["problems"][0]["problem"]
    assert nothing_stored(env)


def test_ten_megabyte_body_is_413_before_parsing(env: Env) -> None:
    big = {**GOOD, "labels": {"blob": "x" * (10 * 1024 * 1024)}}
    r = env.client.post("/v1/jobs", json=big, headers=env.alice)
    assert r.status_code == 413
    assert "larger than the limit" in r.json()["detail"]
    assert nothing_stored(env)


def test_streamed_body_without_length_is_cut_off_at_the_limit(env: Env) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"command": ["python"], "labels": {"blob": "'
        for _ in range(200):
            yield b"y" * 1024
        yield b'"}}'

    r = env.client.post("/v1/jobs", content=chunks(), headers={**env.alice, "Content-Type": "application/json"})
    assert r.status_code == 413
    assert nothing_stored(env)


# --------------------------------------------------------------------------- jobs end to end


def test_submit_list_get_cancel_why(env: Env) -> None:
    job = submit(env, env.alice)
    assert job["phase"] == "Pending" and job["tenant"] == "alice" and job["spec"]["command"] == ["python", "train.py"]
    env.plane.step()  # admitted and placed by the kube policy
    got = env.client.get(f"/v1/jobs/{job['id']}", headers=env.alice).json()
    assert got["phase"] == "Starting" and got["allocation"][0]["node"] in ("n0", "n1")
    starting = env.client.get("/v1/jobs", params={"phase": "Starting"}, headers=env.alice).json()
    assert [j["id"] for j in starting] == [job["id"]]
    assert env.client.get("/v1/jobs", params={"phase": "Queued"}, headers=env.alice).json() == []
    bad_phase = env.client.get("/v1/jobs", params={"phase": "Sleeping"}, headers=env.alice)
    assert bad_phase.status_code == 422 and bad_phase.json()["problems"][0]["field"].startswith("phase")

    cancelled = env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.alice)
    assert cancelled.status_code == 200
    attempt = env.plane.controller.jobs[job["id"]].attempt
    env.engine.pending.append(JobExited(job["id"], attempt, env.engine.now, -15))
    env.plane.step()
    assert env.client.get(f"/v1/jobs/{job['id']}", headers=env.alice).json()["phase"] == "Cancelled"
    again = env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.alice)
    assert again.status_code == 409 and again.json()["error"] == "conflict"

    why = env.client.get(f"/v1/jobs/{job['id']}/why", headers=env.alice).json()
    seqs = [e["seq"] for e in why]
    assert seqs == sorted(seqs)
    text = " | ".join(e["message"] for e in why)
    assert "submitted by tenant alice" in text and "Cancelled" in text
    assert "Queued -> Starting: kube: fits on" in text  # the placement decision with its reason


def test_logs_plain_and_followed_until_the_job_ends(env: Env) -> None:
    job = submit(env, env.alice)
    env.plane.step()
    attempt = env.plane.controller.jobs[job["id"]].attempt
    env.engine.pending.append(JobStarted(job["id"], attempt, "n0", env.engine.now, pid=1))
    env.plane.step()
    log = env.engine.log_dir / f"{job['id']}.log"
    log.write_text("epoch 1\n")
    assert env.client.get(f"/v1/jobs/{job['id']}/logs", headers=env.alice).text == "epoch 1\n"

    def finish() -> None:
        with log.open("a") as f:
            f.write("epoch 2\ndone\n")
        env.engine.pending.append(JobExited(job["id"], attempt, env.engine.now, 0))
        env.plane.step()

    received = []
    with env.client.stream("GET", f"/v1/jobs/{job['id']}/logs?follow=true", headers=env.alice) as r:
        assert r.status_code == 200
        finisher = None
        for chunk in r.iter_text():
            received.append(chunk)
            if finisher is None:
                finisher = threading.Thread(target=finish)
                finisher.start()
        assert finisher is not None
        finisher.join()
    assert "".join(received) == "epoch 1\nepoch 2\ndone\n"
    assert env.plane.store.get_job(job["id"]).phase == Phase.SUCCEEDED


def test_progress_after_reports(env: Env) -> None:
    from sluice.model import JobProgress

    job = submit(env, env.alice)
    assert env.client.get(f"/v1/jobs/{job['id']}/progress", headers=env.alice).status_code == 200
    env.plane.step()
    attempt = env.plane.controller.jobs[job["id"]].attempt
    env.engine.pending += [
        JobStarted(job["id"], attempt, "n0", env.engine.now),
        JobProgress(job["id"], attempt, env.engine.now + 1, step=10, loss=2.0),
        JobProgress(job["id"], attempt, env.engine.now + 2, step=20, loss=float("nan")),
    ]
    env.plane.step()
    prog = env.client.get(f"/v1/jobs/{job['id']}/progress", headers=env.alice)
    assert prog.status_code == 200
    assert prog.json()["step"] == 20


# --------------------------------------------------------------------------- nodes, tenants, system


def test_nodes_cordon_and_uncordon(env: Env) -> None:
    names = [n["name"] for n in env.client.get("/v1/nodes", headers=env.alice).json()]
    assert names == ["n0", "n1"]
    missing_reason = env.client.post("/v1/nodes/n0/cordon", json={}, headers=env.admin)
    assert missing_reason.status_code == 422 and missing_reason.json()["problems"][0]["field"] == "reason"
    r = env.client.post("/v1/nodes/n0/cordon", json={"reason": "disk failing"}, headers=env.admin)
    assert r.status_code == 200 and r.json()["health"] == "Cordoned" and r.json()["reason"] == "disk failing"
    assert env.client.post("/v1/nodes/nx/cordon", json={"reason": "x"}, headers=env.admin).status_code == 404
    r = env.client.post("/v1/nodes/n0/uncordon", headers=env.admin)
    assert r.status_code == 200 and r.json()["health"] == "Healthy"
    assert [e.message for e in env.plane.store.events(node="n0")][-2:] == [
        "n0 -> Cordoned: disk failing",
        "n0 -> Healthy: uncordoned by operator",
    ]


def test_tenants_create_list_delete(env: Env) -> None:
    r = env.client.post("/v1/tenants", json={"name": "carol", "max_running_jobs": 2}, headers=env.admin)
    assert r.status_code == 201
    token = r.json()["token"]
    stored = env.plane.store.get_tenant("carol")
    assert stored is not None and stored.max_running_jobs == 2 and token not in stored.token_hash
    listed = env.client.get("/v1/tenants", headers=env.admin).json()
    assert [t["name"] for t in listed] == ["admin", "alice", "bob", "carol", "default"]
    assert all("token" not in t and "token_hash" not in t for t in listed)
    assert env.client.get("/v1/jobs", headers=bearer(token)).status_code == 200
    bad = env.client.post("/v1/tenants", json={"name": "Not Valid!"}, headers=env.admin)
    assert bad.status_code == 422 and bad.json()["problems"][0]["field"] == "name"
    assert env.client.post("/v1/tenants", json={"name": "carol"}, headers=env.admin).status_code == 409
    assert env.client.delete("/v1/tenants/carol", headers=env.admin).status_code == 204
    assert env.client.get("/v1/jobs", headers=bearer(token)).status_code == 401
    assert env.client.delete("/v1/tenants/carol", headers=env.admin).status_code == 404


def test_healthz_metrics_and_docs(env: Env) -> None:
    assert env.client.get("/healthz").json() == {"status": "ok"}
    submit(env, env.alice)
    for _ in range(3):
        env.plane.step()
    metrics = env.client.get("/metrics").text
    assert 'sluice_jobs{phase="Starting"} 1.0' in metrics
    assert 'sluice_jobs{phase="Running"} 0.0' in metrics
    assert "sluice_reconcile_rounds_total 3.0" in metrics
    assert "sluice_reconcile_round_seconds_count 2.0" in metrics  # observed one round late
    paths = env.client.get("/openapi.json").json()["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}/why", "/v1/nodes/{name}/cordon", "/v1/tenants"} <= set(paths)
    assert env.client.get("/docs").status_code == 200
