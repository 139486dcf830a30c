"""Tenants over the API and the CLI: a deleted tenant's name is never given out again (its
jobs, logs and checkpoints are kept under that name), deleting a tenant takes its queue
grants and is refused while it has unfinished jobs or datasets, and an admin-set
`max_priority` caps the priority a tenant's jobs are submitted or resumed with
(docs/security.md, docs/queues.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.control.priorities import PriorityClassService
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import DatasetSpec, SpecError, parse_job_spec
from sluice.store.base import DatasetRecord
from sluice.store.sql import SqlStore

from ..live_api import run_cli, serve_for_cli
from .fake_engine import FakeEngine


@dataclass
class Env:
    plane: ControlPlane
    client: TestClient
    settings: Settings
    tokens: dict[str, str]

    def who(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[name]}"}

    def new_tenant(self, body: dict[str, Any]) -> Any:
        r = self.client.post("/v1/tenants", json=body, headers=self.who("admin"))
        if r.status_code == 201:
            self.tokens[body["name"]] = r.json()["token"]
        return r

    def submit(self, who: str, **fields: Any) -> Any:
        return self.client.post("/v1/jobs", json={**JOB, **fields}, headers=self.who(who))


JOB = {"name": "mnist", "command": ["python", "train.py"], "resources": {"cpu": {"min": 1, "max": 2}}}


def _plane(settings: Settings) -> ControlPlane:
    return ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    settings = Settings(home=tmp_path / "home")
    plane = _plane(settings)
    tokens = plane.bootstrap_tenants()
    with TestClient(create_app(plane)) as client:
        yield Env(plane, client, settings, tokens)
    plane.store.close()


# ---------------------------------------------------------------- a deleted tenant's name


def test_a_deleted_tenants_name_is_never_given_out_again(env: Env) -> None:
    """The walkthrough's D2: a newcomer created under a deleted tenant's name saw its jobs (env
    secrets included), logs, checkpoints and queue grants, all kept under the name."""
    assert env.new_tenant({"name": "carol"}).status_code == 201
    assert env.client.post("/v1/queues", json={"name": "research"}, headers=env.who("admin")).status_code == 201
    grant = {"tenant": "carol", "granted": True}
    assert env.client.post("/v1/queues/research/grants", json=grant, headers=env.who("admin")).status_code == 200
    r = env.submit("carol", queue="research", env={"SECRET": "carol-secret-123"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=env.who("carol")).status_code == 200
    env.plane.step()

    assert env.client.delete("/v1/tenants/carol", headers=env.who("admin")).status_code == 204
    r = env.new_tenant({"name": "carol"})
    assert r.status_code == 409, r.text
    assert "tenant name 'carol' belonged to a deleted tenant" in r.text and "choose another name" in r.text
    listed = env.client.get("/v1/tenants", headers=env.who("admin")).json()["items"]
    assert "carol" not in [t["name"] for t in listed]
    # its grants went with it: a queue granted to nobody now
    queues = env.client.get("/v1/queues", headers=env.who("admin")).json()["items"]
    assert next(q for q in queues if q["name"] == "research")["tenants"] == []
    # the admin still reads the old job; the old token reads nothing
    old = env.client.get(f"/v1/jobs/{job_id}", headers=env.who("admin"))
    assert old.status_code == 200 and old.json()["tenant"] == "carol"
    assert env.client.get(f"/v1/jobs/{job_id}", headers=env.who("carol")).status_code == 401

    # the name stays retired after a restart of the plane
    env.plane.store.close()
    again = _plane(env.settings)
    try:
        with TestClient(create_app(again)) as client:
            r = client.post("/v1/tenants", json={"name": "carol"}, headers=env.who("admin"))
            assert r.status_code == 409 and "belonged to a deleted tenant" in r.text
    finally:
        again.store.close()


def test_deleting_a_tenant_with_unfinished_jobs_names_them(env: Env) -> None:
    assert env.new_tenant({"name": "carol"}).status_code == 201
    job_id = env.submit("carol").json()["id"]
    r = env.client.delete("/v1/tenants/carol", headers=env.who("admin"))
    assert r.status_code == 409 and job_id in r.text and "unfinished" in r.text and "admin.token" in r.text
    assert env.client.get("/v1/jobs", headers=env.who("carol")).status_code == 200  # still there


def test_deleting_a_tenant_that_owns_datasets_names_them(env: Env) -> None:
    assert env.new_tenant({"name": "carol"}).status_code == 201
    env.plane.store.create_dataset(DatasetRecord("carol", "imgs", DatasetSpec(name="imgs", source="/data")))
    r = env.client.delete("/v1/tenants/carol", headers=env.who("admin"))
    assert r.status_code == 409 and "imgs" in r.text and "dataset" in r.text
    env.plane.store.delete_dataset("carol", "imgs")
    assert env.client.delete("/v1/tenants/carol", headers=env.who("admin")).status_code == 204


def test_the_cli_refuses_a_deleted_tenants_name(env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with serve_for_cli(env.plane, env.settings.home, env.tokens, monkeypatch):
        code, out, err = run_cli("tenant", "create", "carol")
        assert code == 0, err
        code, out, err = run_cli("tenant", "delete", "carol")
        assert code == 0 and "deleted tenant carol" in out
        code, out, err = run_cli("tenant", "create", "carol")
        assert code != 0 and "belonged to a deleted tenant" in out + err
        code, out, err = run_cli("tenant", "delete", "--help")
        assert code == 0 and "never given to another tenant" in out


# ---------------------------------------------------------------- max_priority


def test_a_capped_tenant_cannot_submit_above_its_cap(env: Env) -> None:
    """The walkthrough's D5: any tenant could preempt every other tenant's running jobs in
    `default` with a bare `priority: 1000`; now an admin caps it."""
    r = env.new_tenant({"name": "carol", "max_priority": 100})
    assert r.status_code == 201 and r.json()["max_priority"] == 100
    r = env.submit("carol", priority=1000)
    assert r.status_code == 422, r.text
    assert "priority" in r.text and "max_priority 100" in r.text and "1000" in r.text
    assert env.submit("carol", priority=100).status_code == 201  # at the cap is fine

    for cls in ({"name": "high", "value": 500}, {"name": "low", "value": 50}):
        assert env.client.post("/v1/priority-classes", json=cls, headers=env.who("admin")).status_code == 201
    r = env.submit("carol", priority_class="high")
    assert r.status_code == 422 and "priority_class" in r.text and "max_priority 100" in r.text, r.text
    assert env.submit("carol", priority_class="low").status_code == 201

    # the admin is not capped, neither for itself nor when it submits for carol
    assert env.submit("admin", priority=1000).status_code == 201
    assert env.submit("admin", priority=1000, tenant="carol").status_code == 201
    # an uncapped tenant is unaffected
    assert env.submit("default", priority=1000).status_code == 201


def test_the_default_class_counts_against_the_cap(env: Env) -> None:
    assert env.new_tenant({"name": "carol", "max_priority": 10}).status_code == 201
    pc = {"name": "normal", "value": 20, "default": True}
    assert env.client.post("/v1/priority-classes", json=pc, headers=env.who("admin")).status_code == 201
    r = env.submit("carol")
    assert r.status_code == 422, r.text
    problem = r.json()["problems"][0] if "problems" in r.json() else r.json()
    assert "priority_class" in str(problem) and "default class 'normal'" in r.text and "max_priority 10" in r.text
    assert env.submit("carol", priority=5).status_code == 201  # a bare priority under the cap


def test_a_negative_cap_holds_a_spec_that_sets_no_priority(env: Env) -> None:
    assert env.new_tenant({"name": "carol", "max_priority": -5}).status_code == 201
    r = env.submit("carol")
    assert r.status_code == 422 and "priority" in r.text and "max_priority -5" in r.text
    assert env.submit("carol", priority=-5).status_code == 201


def test_the_cap_changes_live_and_null_removes_it(env: Env) -> None:
    assert env.new_tenant({"name": "carol"}).status_code == 201
    patch = lambda body: env.client.patch("/v1/tenants/carol", json=body, headers=env.who("admin"))  # noqa: E731
    r = patch({"max_priority": 0})
    assert r.status_code == 200 and r.json()["max_priority"] == 0
    r = patch({"weight": 2})  # a patch without it keeps it
    assert r.status_code == 200 and r.json()["max_priority"] == 0
    assert env.submit("carol", priority=1).status_code == 422
    r = patch({"max_priority": None})
    assert r.status_code == 200 and r.json()["max_priority"] is None
    assert env.submit("carol", priority=1000).status_code == 201
    listed = env.client.get("/v1/tenants", headers=env.who("admin")).json()["items"]
    assert {t["name"]: t["max_priority"] for t in listed}["carol"] is None


@pytest.mark.parametrize("value", [1001, -1001, True, "high", 1.5])
def test_a_bad_cap_is_422_naming_max_priority(env: Env, value: Any) -> None:
    r = env.new_tenant({"name": "carol", "max_priority": value})
    assert r.status_code == 422 and "max_priority" in r.text, r.text
    assert env.new_tenant({"name": "dave"}).status_code == 201
    r = env.client.patch("/v1/tenants/dave", json={"max_priority": value}, headers=env.who("admin"))
    assert r.status_code == 422 and "max_priority" in r.text, r.text
    for edge in (1000, -1000):  # the priority range's ends are caps
        r = env.client.patch("/v1/tenants/dave", json={"max_priority": edge}, headers=env.who("admin"))
        assert r.status_code == 200 and r.json()["max_priority"] == edge, r.text


def test_resume_above_a_lowered_cap_is_refused_naming_priority(env: Env) -> None:
    assert env.new_tenant({"name": "carol"}).status_code == 201
    job_id = env.submit("carol", priority=500).json()["id"]
    assert env.client.post(f"/v1/jobs/{job_id}/suspend", headers=env.who("carol")).status_code == 200
    env.plane.step()
    r = env.client.patch("/v1/tenants/carol", json={"max_priority": 100}, headers=env.who("admin"))
    assert r.status_code == 200
    r = env.client.post(f"/v1/jobs/{job_id}/resume", headers=env.who("carol"))
    assert r.status_code == 409, r.text
    assert "priority" in r.text and "max_priority 100" in r.text and "--resume-from" in r.text
    assert env.client.post(f"/v1/jobs/{job_id}/resume", headers=env.who("admin")).status_code == 200


def test_the_cli_sets_shows_and_removes_the_cap(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    with serve_for_cli(env.plane, env.settings.home, env.tokens, monkeypatch):
        code, _, err = run_cli("tenant", "create", "carol", "--max-priority", "100")
        assert code == 0, err
        code, out, _ = run_cli("tenant", "list", "-o", "json")
        assert code == 0 and {t["name"]: t["max_priority"] for t in json.loads(out)}["carol"] == 100
        code, out, _ = run_cli("tenant", "list")
        assert code == 0 and "MAX PRIORITY" in out
        carol = next(line for line in out.splitlines() if "carol" in line)
        assert "100" in carol
        code, out, err = run_cli("tenant", "set", "carol", "--max-priority", "-3")
        assert code == 0 and "max priority -3" in out, err
        code, out, err = run_cli("tenant", "set", "carol", "--max-priority", "none")
        assert code == 0 and "max priority no cap" in out, err
        assert env.plane.store.get_tenant("carol").max_priority is None  # type: ignore[union-attr]
        code, out, err = run_cli("tenant", "set", "carol", "--max-priority", "lots")
        assert code == 2 and "--max-priority" in out + err and "'lots'" in out + err
        code, out, err = run_cli("tenant", "create", "dave", "--max-priority", "5000")
        assert code == 2 and "max_priority" in out + err


def test_the_cap_message_reads_as_a_sentence() -> None:
    # It read "5 is above tenant 'alice''s max_priority 0; use one of 0 or lower, ...".
    spec = parse_job_spec({"command": ["x"], "priority": 5})
    with pytest.raises(SpecError) as info:
        PriorityClassService.check_cap("alice", 0, spec, spec)
    assert str(info.value) == (
        "priority: 5 is above the max_priority 0 of tenant 'alice'; use 0 or lower, or ask an admin to raise the cap"
    )
