"""`net_interface` binds the Ray node sluice starts: a veth interface with a 10.x address is
created for the test (root only), and the Ray instance the Ray engine starts advertises that
address, and its node agent reports the same address for the interface; an interface that
does not exist, or has no address, refuses the start with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.agent.netif import NetInterfaceUnavailable, interface_ipv4
from sluice.net.ipcmd import tool
from tests.session_env import clean_env

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(300)]

IP = tool("ip")
SRC = str(Path(__file__).resolve().parents[2] / "src")
SLUICE = str(Path(sys.executable).with_name("sluice"))
ADDR = f"10.217.{os.getpid() % 250 + 1}.1"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or IP is None, reason="creating a network interface needs root and iproute2"
)

PROBE = """
import json, sys, time
t0 = time.monotonic()
import ray
from sluice.engine.ray import RayEngine
from sluice.settings import load_settings
engine = RayEngine(load_settings())
t1 = time.monotonic()
labels = {}
deadline = time.monotonic() + 120  # the node agent's actor starting: a guard, not a speed check
while not labels.get("net-interface-ip") and time.monotonic() < deadline:
    engine.poll()
    labels = {k: v for n in engine.nodes() for k, v in n.labels.items()}
    time.sleep(0.2)
print(f"ray up {t1 - t0:.1f}s, agent label {time.monotonic() - t1:.1f}s", file=sys.stderr)
ray_ips = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]
print(json.dumps({"ray": ray_ips, "label": labels.get("net-interface-ip")}))
ray.shutdown()
"""


def _ip(*args: str) -> None:
    assert IP is not None
    subprocess.run([IP, *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def veth() -> Iterator[str]:
    """A veth pair in the host namespace (this kernel has no `dummy` links); the test binds to
    one end. Deleting one end deletes both."""
    name = f"slray{os.getpid() % 100000}"
    _ip("link", "add", name, "type", "veth", "peer", "name", name + "p")
    try:
        _ip("link", "set", name + "p", "up")
        _ip("link", "set", name, "up")
        yield name
    finally:
        subprocess.run([IP or "ip", "link", "del", name], capture_output=True, timeout=10)


def _env(home: Path, iface: str) -> dict[str, str]:
    env = clean_env(drop=("SLUICE_", "RAY_"))
    env |= {"SLUICE_HOME": str(home), "SLUICE_NET_INTERFACE": iface, "SLUICE_ENGINE": "ray"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH", "")) if p)
    return env


def test_a_missing_interface_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(NetInterfaceUnavailable, match="no such network interface"):
        interface_ipv4("sl-absent0")
    # as a user meets it: `sluice up --engine ray` stops before starting Ray, naming the setting
    out = subprocess.run(
        [SLUICE, "up", "--engine", "ray", "--port", "0"],
        env=_env(tmp_path / "home", "sl-absent0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "net_interface 'sl-absent0': no such network interface" in out.stderr


@needs_root
def test_the_ray_node_sluice_starts_is_bound_to_net_interface(tmp_path: Path, veth: str) -> None:
    with pytest.raises(NetInterfaceUnavailable, match="no IPv4 address"):
        interface_ipv4(veth)
    _ip("addr", "add", f"{ADDR}/32", "dev", veth)
    assert interface_ipv4(veth) == ADDR
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=_env(tmp_path / "home", veth), capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"ray": [ADDR], "label": ADDR}, (got, out.stderr[-2000:])
