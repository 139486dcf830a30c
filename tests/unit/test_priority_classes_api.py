"""Priority classes over the API (docs/queues.md): admin-only management, 422s naming the
field at submit, 409 on deleting a class in use, and the class recorded on the job."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import TenantSpec
from sluice.store.sql import SqlStore

from .fake_engine import FakeEngine


@dataclass
class Env:
    plane: ControlPlane
    client: TestClient
    admin: dict[str, str]
    alice: dict[str, str]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    settings = Settings(home=tmp_path / "home")
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    admin = plane.authenticate(tokens["admin"])
    _, alice = plane.create_tenant(admin, TenantSpec(name="alice"))
    with TestClient(create_app(plane)) as client:
        yield Env(plane, client, {"Authorization": f"Bearer {tokens['admin']}"}, {"Authorization": f"Bearer {alice}"})
    plane.store.close()


JOB = {"name": "mnist", "command": ["python", "train.py"], "resources": {"cpu": {"min": 1, "max": 2}}}


def create(env: Env, body: dict[str, Any], who: dict[str, str] | None = None) -> Any:
    return env.client.post("/v1/priority-classes", json=body, headers=who or env.admin)


def test_admin_creates_lists_and_deletes_tenants_only_list(env: Env) -> None:
    r = create(env, {"name": "high", "value": 100, "description": "production"})
    assert r.status_code == 201, r.text
    assert r.json()["preemption"] == "allowed" and r.json()["default"] is False
    assert create(env, {"name": "batch", "value": -10, "preemption": "never"}).status_code == 201
    assert create(env, {"name": "sneaky", "value": 999}, env.alice).status_code == 403
    listed = env.client.get("/v1/priority-classes", headers=env.alice).json()["items"]
    assert [(p["name"], p["value"], p["preemption"]) for p in listed] == [
        ("batch", -10, "never"),
        ("high", 100, "allowed"),
    ]
    assert env.client.delete("/v1/priority-classes/high", headers=env.alice).status_code == 403
    assert env.client.delete("/v1/priority-classes/high", headers=env.admin).status_code == 204
    assert env.client.delete("/v1/priority-classes/high", headers=env.admin).status_code == 404
    assert create(env, {"name": "batch", "value": 1}).status_code == 409


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "value": 5000}, "value"),
        ({"name": "Bad Name!", "value": 1}, "name"),
        ({"name": "x", "value": 1, "preemption": "sometimes"}, "preemption"),
    ],
)
def test_bad_class_is_422_naming_the_field(env: Env, body: dict[str, Any], field: str) -> None:
    r = create(env, body)
    assert r.status_code == 422 and field in r.text


def test_only_one_default_class(env: Env) -> None:
    assert create(env, {"name": "normal", "value": 0, "default": True}).status_code == 201
    r = create(env, {"name": "other", "value": 1, "default": True})
    assert r.status_code == 409 and "normal" in r.json()["detail"]
    # It ended "only one class can be", as if cut off; it now says what to do.
    assert r.json()["detail"] == (
        "priority class 'normal' is already the default, and only one class can be: "
        "create 'other' without making it the default, or delete 'normal' first"
    )


def test_job_gets_its_priority_from_its_class_and_why_says_so(env: Env) -> None:
    create(env, {"name": "high", "value": 100})
    r = env.client.post("/v1/jobs", json={**JOB, "priority_class": "high"}, headers=env.alice)
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["spec"]["priority"], job["spec"]["priority_class"]) == (100, "high")
    why = env.client.get(f"/v1/jobs/{job['id']}/why", headers=env.alice).json()["items"]
    assert any("priority class high: priority 100" in e["message"] for e in why)
    # the resolved spec can be submitted again (same value): Kubernetes' rule
    again = env.client.post("/v1/jobs", json=job["spec"] | {"tenant": None}, headers=env.alice)
    assert again.status_code == 201, again.text


def test_unknown_class_and_contradicting_priority_are_422_naming_the_field(env: Env) -> None:
    create(env, {"name": "high", "value": 100})
    r = env.client.post("/v1/jobs", json={**JOB, "priority_class": "nope"}, headers=env.alice)
    assert r.status_code == 422 and "priority_class" in r.text and "nope" in r.text
    r = env.client.post("/v1/jobs", json={**JOB, "priority_class": "high", "priority": 5}, headers=env.alice)
    assert r.status_code == 422 and '"priority"' in r.text and "contradicts" in r.text
    assert env.plane.store.list_jobs() == []


def test_default_class_applies_only_to_jobs_that_set_neither(env: Env) -> None:
    create(env, {"name": "normal", "value": 10, "default": True})
    plain = env.client.post("/v1/jobs", json=JOB, headers=env.alice).json()
    assert (plain["spec"]["priority"], plain["spec"]["priority_class"]) == (10, "normal")
    bare = env.client.post("/v1/jobs", json={**JOB, "priority": 3}, headers=env.alice).json()
    assert (bare["spec"]["priority"], bare["spec"]["priority_class"]) == (3, None)


def test_delete_in_use_is_409_with_the_reason_until_the_job_ends(env: Env) -> None:
    create(env, {"name": "high", "value": 100})
    job = env.client.post("/v1/jobs", json={**JOB, "priority_class": "high"}, headers=env.alice).json()
    r = env.client.delete("/v1/priority-classes/high", headers=env.admin)
    assert r.status_code == 409 and job["id"] in r.json()["detail"] and "unfinished" in r.json()["detail"]
    assert env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.alice).status_code == 200
    env.plane.step()
    assert env.client.delete("/v1/priority-classes/high", headers=env.admin).status_code == 204


def test_a_class_deleted_while_a_submit_is_on_its_way_gets_no_job(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A submit resolves its class outside the controller's lock, and the delete removed the
    class after releasing it: a delete in between left an unfinished job whose class no longer
    existed ("a job's class always exists", docs/queues.md). Now the delete checks and deletes
    under the lock, and the submit checks the class again under it where the job is made."""
    assert create(env, {"name": "high", "value": 100}).status_code == 201
    resolve = env.plane.priorities.resolve

    def then_deleted(spec: Any) -> Any:
        out = resolve(spec)
        env.plane.priorities.delete("high")  # no job of the class yet
        return out

    monkeypatch.setattr(env.plane.priorities, "resolve", then_deleted)
    r = env.client.post("/v1/jobs", json={**JOB, "priority_class": "high"}, headers=env.alice)
    assert r.status_code == 422, r.text
    assert r.json()["problems"][0]["field"] == "priority_class"
    assert "was deleted while this job was being submitted" in r.json()["problems"][0]["problem"]
    assert not [j for j in env.plane.controller.book.live() if j.spec.priority_class == "high"]
