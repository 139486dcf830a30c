"""`POST /v1/nodes/{node}/faults` takes exact types and no more memory than the node has
(walkthrough 4: `seconds: true` was read as 1 s; a memory fault could ask for 1 TiB on a node
of a few GiB, taking the whole machine, every other node of it included)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.agent import faults
from sluice.agent.faults import FaultReport
from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.model import NodeInfo
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.store.sql import SqlStore

from .fake_engine import FakeEngine


@dataclass
class FaultyEngine(FakeEngine):
    """A fake engine whose nodes take faults (recorded, nothing run): a fake medium."""

    faults: list[tuple[str, str, float, int]] = field(default_factory=list)

    def inject_fault(
        self, node: str, kind: str, seconds: float, workers: int | None = None, memory_mb: int = 512
    ) -> FaultReport:
        self.faults.append((node, kind, seconds, memory_mb))
        return FaultReport(node, kind, seconds, [0], [], kind)

    def stop_faults(self, node: str) -> int:
        return 0


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, FaultyEngine, dict[str, str]]]:
    settings = Settings(home=tmp_path / "home")
    engine = FaultyEngine(node_infos=[NodeInfo("n0", 2.0, memory_mb=4096)])
    plane = ControlPlane(settings, SqlStore(settings.db_url), engine, make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    plane.controller.step()  # the nodes join
    with TestClient(create_app(plane)) as http:
        yield http, engine, {"Authorization": f"Bearer {tokens['admin']}"}
    plane.store.close()


@pytest.mark.parametrize(
    ("body", "field_"),
    [
        ({"kind": "cpu", "seconds": True}, "seconds"),
        ({"kind": "cpu", "seconds": "5"}, "seconds"),
        ({"kind": "cpu", "seconds": 5, "workers": True}, "workers"),
        ({"kind": "memory", "seconds": 5, "memory_mb": 8192}, "memory_mb"),
        ({"kind": "memory", "seconds": 5, "workers": 4}, "workers"),  # it ran one worker (walk5)
        ({"kind": "cpu", "seconds": 5, "memory_mb": 64}, "memory_mb"),  # it held nothing
    ],
)
def test_a_fault_request_is_refused_naming_the_field(
    api: tuple[TestClient, FaultyEngine, dict[str, str]], body: dict[str, Any], field_: str
) -> None:
    http, engine, admin = api
    r = http.post("/v1/nodes/n0/faults", json=body, headers=admin)
    assert r.status_code == 422, r.text
    assert field_ in r.text
    assert engine.faults == []


def test_a_fault_within_the_node_is_injected(api: tuple[TestClient, FaultyEngine, dict[str, str]]) -> None:
    http, engine, admin = api
    r = http.post("/v1/nodes/n0/faults", json={"kind": "memory", "seconds": 5, "memory_mb": 1024}, headers=admin)
    assert r.status_code in (200, 201), r.text
    assert engine.faults == [("n0", "memory", 5.0, 1024)]


def test_a_tenant_is_refused_before_its_body_is_judged(tmp_path: Path) -> None:
    """A non-admin's cordon or fault with a bad body was a 422 about the body, not a 403."""
    from sluice.spec import TenantSpec

    settings = Settings(home=tmp_path / "home")
    plane = ControlPlane(settings, SqlStore(settings.db_url), FaultyEngine(), make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    _, token = plane.create_tenant(plane.authenticate(tokens["admin"]), TenantSpec(name="bob"), force=True)
    plane.controller.step()
    bob = {"Authorization": f"Bearer {token}"}
    try:
        with TestClient(create_app(plane)) as http:
            for path in ("/v1/nodes/n0/cordon", "/v1/nodes/n0/faults"):
                r = http.post(path, json={}, headers=bob)
                assert r.status_code == 403, (path, r.text)
    finally:
        plane.store.close()


@dataclass
class _FakeFault:
    kind: str = "cpu"
    procs: list[Any] = field(default_factory=list)

    def argvs(self) -> list[list[str]]:
        return [["/usr/bin/stress-ng", "--cpu", "1", "--cpu-load", "100", "--taskset", "0,1", "--quiet"]]

    def stop(self) -> None:
        pass


def test_the_fault_report_shows_the_whole_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # It showed the first six words: `... --cpu-load 100 --taskset`, the cores cut off.
    monkeypatch.setattr(faults, "inject", lambda *a, **k: _FakeFault())
    report = faults.FaultBoard("vm", [0, 1]).inject("cpu", 0.1)
    assert report.command == "/usr/bin/stress-ng --cpu 1 --cpu-load 100 --taskset 0,1 --quiet"
