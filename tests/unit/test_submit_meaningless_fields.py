"""A job spec field the plane would ignore or guess at is a 422 naming it at submit (walk5):
a relative `workdir` in a request body ran the job in the plane's own working folder; `qoe`
with both `deadline_s` and `deadline` kept `deadline_s` and silently dropped `deadline`;
`datasets[].access` (random|sequential) was accepted and read by nothing; a dataset named twice
was accepted."""

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
from sluice.store.sql import SqlStore

from .fake_engine import FakeEngine


@dataclass
class Env:
    client: TestClient
    auth: dict[str, str]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    settings = Settings(home=tmp_path / "home")
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    with TestClient(create_app(plane)) as client:
        yield Env(client, {"Authorization": f"Bearer {tokens['default']}"})
    plane.store.close()


JOB: dict[str, Any] = {"name": "j", "command": ["python", "train.py"]}


def submit(env: Env, **fields: Any) -> Any:
    return env.client.post("/v1/jobs", json={**JOB, **fields}, headers=env.auth)


@pytest.mark.parametrize("workdir", [".", "", "sub/dir", "../up"])
def test_a_relative_workdir_is_422_naming_workdir(env: Env, workdir: str) -> None:
    r = submit(env, workdir=workdir)
    assert r.status_code == 422, r.text
    assert [p["field"] for p in r.json()["problems"]] == ["workdir"], r.text
    assert "relative" in r.text


def test_an_absolute_or_no_workdir_is_accepted(env: Env, tmp_path: Path) -> None:
    assert submit(env, workdir=str(tmp_path)).status_code == 201
    assert submit(env).status_code == 201


def test_qoe_with_two_deadlines_is_422_naming_qoe(env: Env) -> None:
    r = submit(env, qoe={"deadline_s": 600, "deadline": "2030-01-01T00:00:00Z"})
    assert r.status_code == 422, r.text
    assert [p["field"] for p in r.json()["problems"]] == ["qoe"], r.text
    assert submit(env, qoe={"deadline_s": 600, "loss": 0.1}).status_code == 201
    assert submit(env, qoe={"deadline": "2030-01-01T00:00:00Z", "loss": 0.1}).status_code == 201


@pytest.mark.parametrize("access", ["random", "sequential"])
def test_a_dataset_access_hint_is_422_naming_it(env: Env, access: str) -> None:
    r = submit(env, datasets=[{"name": "digits", "access": access}])
    assert r.status_code == 422, r.text
    assert "datasets.0.access" in [p["field"] for p in r.json()["problems"]], r.text


def test_a_dataset_named_twice_is_422_naming_the_second(env: Env) -> None:
    """`datasets: [{name: p5}, {name: p5}]` was accepted: the job got the dataset once (data walk s31)."""
    r = submit(env, datasets=[{"name": "digits"}, {"name": "imgs"}, {"name": "digits"}])
    assert r.status_code == 422, r.text
    problems = {p["field"]: p["problem"] for p in r.json()["problems"]}
    assert problems.get("datasets.2.name") == "dataset 'digits' is named twice: name it once", r.text
    assert "datasets.0.name" not in problems and "datasets.1.name" not in problems, r.text


@pytest.mark.parametrize(
    "key", ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK"]
)
def test_an_env_value_sluice_sets_for_each_attempt_is_422_naming_it(env: Env, key: str) -> None:
    """`env: {CUDA_VISIBLE_DEVICES: "0"}` was accepted and the job saw the GPUs placement gave
    it instead (a gang's RANK, WORLD_SIZE, MASTER_* likewise) (walk5 D11)."""
    r = env.client.post("/v1/jobs", json={**JOB, "env": {key: "0", "MY_SETTING": "1"}}, headers=env.auth)
    assert r.status_code == 422, r.text
    assert [p["field"] for p in r.json()["problems"]] == [f"env.{key}"], r.text
    ok = env.client.post("/v1/jobs", json={**JOB, "env": {"MY_SETTING": "1", "OMP_NUM_THREADS": "1"}}, headers=env.auth)
    assert ok.status_code == 201, ok.text


def test_resume_from_a_job_you_do_not_have_is_422_naming_resume_from(env: Env) -> None:
    """It was a 404 'job not found' naming no field (walk5 D17); another tenant's job reads
    the same as one that does not exist."""
    r = env.client.post("/v1/jobs", json={**JOB, "resume_from": "j-nope"}, headers=env.auth)
    assert r.status_code == 422, r.text
    assert r.json()["problems"] == [{"field": "resume_from", "problem": "you have no job 'j-nope'"}]
