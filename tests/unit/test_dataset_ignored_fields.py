"""Dataset fields nothing reads are refused at create with a 422 naming them (walk5): `cache:
false` was stored and shown while `warm` cached the dataset 100 % and jobs read it through the
cache; `format: blocks` was stored and read by nothing (a source is always read as raw files)."""

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
    data: Path


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"x" * 10)
    settings = Settings(home=tmp_path / "home", dataset_roots=[str(tmp_path)], isolation="off")
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    with TestClient(create_app(plane)) as client:
        yield Env(client, {"Authorization": f"Bearer {tokens['default']}"}, data)
    plane.store.close()


def create(env: Env, **fields: Any) -> Any:
    body = {"name": "d", "source": str(env.data), **fields}
    return env.client.post("/v1/datasets", json=body, headers=env.auth)


def fields(r: Any) -> list[str]:
    return [p["field"] for p in r.json()["problems"]]


def test_cache_false_is_422_naming_cache(env: Env) -> None:
    r = create(env, cache=False)
    assert r.status_code == 422 and fields(r) == ["cache"], r.text
    assert create(env, cache=True).status_code == 201


def test_format_blocks_is_422_naming_format(env: Env) -> None:
    r = create(env, format="blocks")
    assert r.status_code == 422 and fields(r) == ["format"], r.text
    assert create(env, format="files").status_code == 201
