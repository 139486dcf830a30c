"""A real control plane (SqlStore, the real FastAPI app in process) with two ordinary tenants,
for the confinement and dataset-tenancy attack tests. The engine is tests/unit/fake_engine.py's
FakeEngine — a fake, because no job process runs here: what is under test is what the API
accepts and what it lets one tenant see of another's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import TenantSpec
from sluice.store.sql import SqlStore

from ..unit.fake_engine import FakeEngine


@dataclass
class Api:
    plane: ControlPlane
    http: TestClient
    tokens: dict[str, str]

    def call(self, who: str, method: str, path: str, **kw: Any) -> Any:
        return self.http.request(method, path, headers={"Authorization": f"Bearer {self.tokens[who]}"}, **kw)


def problem_fields(resp: Any) -> list[str]:
    """The fields a 422 names."""
    return [p["field"] for p in resp.json().get("problems", [])]


@contextmanager
def live_plane(tmp: Path, monkeypatch: Any, **settings: Any) -> Iterator[Api]:
    """Tenants `alice` and `bob` (ordinary) and `admin`; the plane's node cache under `tmp`."""
    home = tmp / f"home-{uuid.uuid4().hex[:6]}"  # a fresh plane each time, even within one test
    home.mkdir()
    monkeypatch.setenv("SLUICE_CACHE_DISK_DIR", str(tmp / "cache"))
    monkeypatch.setenv("SLUICE_CACHE_MEMORY_DIR", str(tmp / f"mem-{uuid.uuid4().hex[:6]}"))
    monkeypatch.setenv("SLUICE_CACHE_MEMORY_BYTES", str(16 << 20))
    conf = Settings(home=home, **settings)
    plane = ControlPlane(conf, SqlStore(conf.db_url), FakeEngine(), make_policy("data-aware"))
    tokens = plane.bootstrap_tenants()
    admin = plane.authenticate(tokens["admin"])
    for name in ("alice", "bob"):
        _, tokens[name] = plane.create_tenant(admin, TenantSpec(name=name))
    try:
        with TestClient(create_app(plane)) as http:
            yield Api(plane, http, tokens)
    finally:
        plane.store.close()
