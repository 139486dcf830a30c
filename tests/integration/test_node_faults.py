"""`sluice node fault` end to end: the CLI against a live API server on loopback, a real
ControlPlane with the local engine split into two virtual nodes; the fault processes are
real, pinned to the node's cores, and stop by themselves or on `--stop`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from typer.testing import CliRunner

from sluice.cli.main import app
from sluice.control.plane import ControlPlane
from sluice.settings import Settings
from tests.integration.conftest import process_gone, wait_for

from ..live_api import serve_for_cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.serial,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to split into 2 virtual nodes"),
]
runner = CliRunner()


@pytest.fixture
def live(
    sluice_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ControlPlane, str, dict[str, str]]]:
    settings = sluice_settings.model_copy(update={"virtual_nodes": 2, "policy": "kube"})
    plane = ControlPlane.from_settings(settings)
    tokens = plane.bootstrap_tenants()
    plane.start()
    try:
        with serve_for_cli(plane, settings.home, tokens, monkeypatch) as url:
            assert wait_for(lambda: len(plane.nodes()) == 2)
            yield plane, url, tokens
    finally:
        plane.stop()


def sluice(*args: str) -> tuple[int, str]:
    r = runner.invoke(app, list(args))
    if r.exception and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout + r.stderr


def gone(pids: list[int]) -> bool:
    return all(process_gone(p) for p in pids)


def test_fault_runs_pinned_to_the_node_and_stops_by_itself_or_on_stop(
    live: tuple[ControlPlane, str, dict[str, str]],
) -> None:
    plane, _, _ = live
    cores = sorted(int(c) for c in plane.controller.node("node-1").labels["cores"].split(","))

    code, out = sluice("node", "fault", "node-1", "cpu", "--seconds", "3", "--workers", "1", "-o", "json")
    assert code == 0, out
    report = json.loads(out)
    assert report["kind"] == "cpu" and report["cores"] == cores and report["pids"]
    for pid in report["pids"]:
        assert sorted(psutil.Process(pid).cpu_affinity()) == cores  # node-1's cores, not the machine's
    groups = plane.engine.agents["node-1"].groups  # type: ignore[attr-defined]
    if groups.usage is not None:  # started inside node-1's own cgroups, so its node_* KPIs see it

        def groups_of(pid: int) -> list[str]:
            return Path(f"/proc/{pid}/cgroup").read_text().splitlines()

        for pid in report["pids"]:
            # The launcher joins the node's groups as its first act, then execs the fault.
            assert wait_for(lambda pid=pid: any("/node-1" in g for g in groups_of(pid)), 10), groups_of(pid)
            assert not any("/node-0" in g for g in groups_of(pid)), groups_of(pid)
    assert wait_for(lambda: gone(report["pids"]), 20), "the fault did not stop after its duration"

    code, out = sluice("node", "why", "node-1")
    assert code == 0 and out.startswith("node-1: Healthy"), out
    assert "no health monitor watches this node" in out, out  # this plane runs none

    code, out = sluice("node", "fault", "node-1", "io", "--seconds", "600", "-o", "json")
    assert code == 0, out
    io = json.loads(out)
    assert not gone(io["pids"])
    code, out = sluice("node", "fault", "node-1", "--stop")
    assert code == 0 and "1 fault(s) stopped" in out, out
    assert wait_for(lambda: gone(io["pids"]), 10)

    code, out = sluice("node", "fault", "node-1", "net", "--seconds", "600", "--workers", "1", "-o", "json")
    assert code == 0, out
    net = json.loads(out)
    assert net["kind"] == "net" and not gone(net["pids"])
    if groups.net is not None:  # in node-1's own net_cls group: its egress is node-1's "other"
        procs = groups.net.group / "cgroup.procs"
        assert wait_for(lambda: str(net["pids"][0]) in procs.read_text().split(), 10)
        assert wait_for(lambda: groups.net.counters().get("net_other_tx_bytes", 0) > 1e6, 10)
    code, out = sluice("node", "fault", "node-1", "--stop")
    assert code == 0 and "1 fault(s) stopped" in out, out
    assert wait_for(lambda: gone(net["pids"]), 10)

    history = [e.message for e in plane.store.events(node="node-1")]
    assert any("cpu fault injected by admin for 3s" in m for m in history), history
    assert any("1 fault(s) stopped by admin" in m for m in history), history


def test_bad_fault_requests_are_refused_with_the_field_named(live: tuple[ControlPlane, str, dict[str, str]]) -> None:
    _, url, tokens = live
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    with httpx.Client(base_url=url, timeout=10) as http:
        r = http.post("/v1/nodes/node-1/faults", json={"kind": "disk", "seconds": 5}, headers=admin)
        assert r.status_code == 422 and r.json()["problems"][0]["field"] == "kind"
        r = http.post("/v1/nodes/node-1/faults", json={"kind": "cpu", "seconds": 0}, headers=admin)
        assert r.status_code == 422 and r.json()["problems"][0]["field"] == "seconds"
        r = http.post("/v1/nodes/node-9/faults", json={"kind": "cpu", "seconds": 5}, headers=admin)
        assert r.status_code == 404 and "node-9" in r.json()["detail"]
        user = {"Authorization": f"Bearer {tokens['default']}"}
        r = http.post("/v1/nodes/node-1/faults", json={"kind": "cpu", "seconds": 5}, headers=user)
        assert r.status_code == 403
        r = http.post("/v1/nodes/node-1/faults", json={"kind": "net", "seconds": 5}, headers=user)
        assert r.status_code == 403
        r = http.post("/v1/nodes/node-1/faults", json={"kind": "net", "seconds": 5, "workers": 0}, headers=admin)
        assert r.status_code == 422 and r.json()["problems"][0]["field"] == "workers"
    code, out = sluice("node", "fault", "node-1")
    assert code == 2 and "--stop" in out
    code, out = sluice("node", "fault", "node-1", "disk")
    assert code == 2 and "disk" in out
