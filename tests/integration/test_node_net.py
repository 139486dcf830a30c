"""Per-node and per-job network egress on the real kernel: net_cls groups tag the packets of
the processes inside them, an nft table owned by the agent counts them per class id."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.agent.cgroup import detect_cgroups, remove_root
from sluice.agent.faults import Fault, FaultKind
from sluice.agent.kpi import KpiSampler
from sluice.agent.node_cgroup import node_groups, remove_groups
from sluice.agent.node_net import TABLE_PREFIX, NodeNet, node_net, node_net_v2

pytestmark = [pytest.mark.integration, pytest.mark.serial]

CORE = [max(os.sched_getaffinity(0))]
_SEND = (
    "import os, socket, sys\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); r.bind(('127.0.0.1', 0))\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "for _ in range(int(sys.argv[2])): s.sendto(b'x' * 1000, r.getsockname())\n"
)


_RECV = (
    "import os, socket, sys\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); r.bind(('127.0.0.1', 0)); r.settimeout(20)\n"
    "open(sys.argv[2] + '.tmp', 'w').write(str(r.getsockname()[1])); os.rename(sys.argv[2] + '.tmp', sys.argv[2])\n"
    "try:\n"
    "    for _ in range(int(sys.argv[3])): r.recv(2000); r.settimeout(2)\n"
    "except TimeoutError:\n"
    "    pass  # datagrams a full socket buffer dropped were counted on the way in all the same\n"
)
_SEND_TO = (
    "import os, socket, sys\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "for _ in range(int(sys.argv[3])): s.sendto(b'x' * 1000, ('127.0.0.1', int(sys.argv[2])))\n"
)


def _tables() -> list[str]:
    nft = shutil.which("nft") or "nft"
    out = subprocess.run([nft, "-j", "list", "tables", "inet"], capture_output=True, text=True, check=True).stdout
    return [t["table"]["name"] for t in json.loads(out)["nftables"] if "table" in t]


@pytest.fixture
def root() -> Iterator[str]:
    name = f"sluice-test-{uuid.uuid4().hex[:6]}"
    yield name
    remove_root(name)


def _nets(root: str, *nodes: str) -> list[NodeNet]:
    nets = [node_net(n, root) for n in nodes]
    if nets[0].group is None:
        for n in nets:
            n.close()
        pytest.skip(f"no per-node network accounting here: {nets[0].missing}")
    return nets


def _send(procs: str, packets: int) -> None:
    subprocess.run([sys.executable, "-c", _SEND, procs, str(packets)], check=True, timeout=30)


def test_a_jobs_traffic_counts_for_the_job_and_its_node_and_not_another_node(root: str) -> None:
    a, b = _nets(root, "a", "b")
    try:
        job = a.job_group("job-1.1")
        assert job is not None and a.table != b.table and a.table in _tables()
        _send(job, 300)
        _send(a.procs or "", 100)  # something in node a that is not a job
        ca, cb = a.counters(), b.counters()
        assert ca["job:job-1.1:net_tx_bytes"] == pytest.approx(300 * 1028)
        assert ca["net_tx_packets"] == 400 and ca["net_tx_bytes"] == pytest.approx(400 * 1028)
        assert ca["net_other_tx_packets"] == 100
        assert cb["net_tx_bytes"] == 0 and cb["net_other_tx_bytes"] == 0
        time.sleep(0.1)  # the kernel drops an exited task from its cgroup a moment later
        a.drop_job("job-1.1")  # the job ended: its rule goes, its bytes stay in the node's total
        assert a.counters()["net_tx_bytes"] == pytest.approx(400 * 1028)
        after = a.counters()
        assert "job:job-1.1:net_tx_bytes" not in after and after["net_tx_bytes"] == pytest.approx(400 * 1028)
        tables, groups = (a.table, b.table), (a.group, b.group)
    finally:
        time.sleep(0.1)
        a.close()
        b.close()
    assert not set(tables) & set(_tables()), "the agent's nft tables outlive it"
    assert all(g is not None and not g.exists() for g in groups)


def test_a_killed_agents_leftover_table_is_removed_by_the_next(root: str) -> None:
    nft = shutil.which("nft")
    if nft is None:
        pytest.skip("no nft command (apt-get install nftables)")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"{TABLE_PREFIX}{dead.pid}_0"
    subprocess.run([nft, "add", "table", "inet", stale], check=True)
    (net,) = _nets(root, "a")
    try:
        assert stale not in _tables()
        assert net.table in _tables()
    finally:
        net.close()


def test_a_net_fault_in_one_node_shows_as_its_other_egress_and_not_its_siblings(root: str) -> None:
    layout = detect_cgroups(root=root)
    a, b = (node_groups(layout, name, root=root) for name in ("a", "b"))
    try:
        if b.net is None:
            pytest.skip(f"no per-node network accounting here: {b.missing}")
        samplers = {g.node: KpiSampler(CORE, gpus=False, groups=g, memory_mb=4096) for g in (a, b)}
        with Fault(FaultKind.NET, CORE, workers=1, join=b.fault_join()) as flood:
            procs = Path(b.net.procs or "")
            deadline = time.monotonic() + 20
            while not all(str(p.pid) in procs.read_text().split() for p in flood.procs):
                assert time.monotonic() < deadline, "the fault never joined b's network group"
                time.sleep(0.05)
            for s in samplers.values():
                s.sample()
            time.sleep(1.5)
            kpis = {n: s.sample() for n, s in samplers.items()}
        assert kpis["b"]["node_net_other_tx_mbps"] > 10.0, kpis["b"]
        assert kpis["b"]["node_net_tx_pps"] > 100.0, kpis["b"]
        assert kpis["a"]["node_net_other_tx_mbps"] == 0.0 and kpis["a"]["node_net_tx_mbps"] == 0.0, kpis["a"]
        if "node_net_rx_mbps" in kpis["b"]:  # v2 groups (a hybrid host): the flood's sink is in b too
            assert kpis["b"]["node_net_other_rx_mbps"] > 10.0, kpis["b"]
            assert kpis["a"]["node_net_rx_mbps"] == 0.0, kpis["a"]
    finally:
        time.sleep(0.2)  # the kernel drops a killed task from its cgroup a moment later
        tables = [g.net.table for g in (a, b) if g.net is not None]
        for g in (a, b):
            remove_groups(g)
    assert not set(tables) & set(_tables())


def _v2_mount() -> Path | None:
    """A writable cgroup v2 hierarchy: the whole tree on a v2-only host, `unified` on a hybrid one."""
    for m in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (m / "cgroup.controllers").exists() and os.access(m, os.W_OK):
            return m
    return None


def test_v2_groups_count_a_nodes_and_its_jobs_egress_and_nothing_of_another_node() -> None:
    """cgroup v2 (`socket cgroupv2 level N`): the node's own v2 groups, no class ids. Run on
    the hybrid host's v2 tree here; on a v2-only host the agent uses it for every node."""
    mount = _v2_mount()
    if mount is None or shutil.which("nft") is None:
        pytest.skip("no writable cgroup v2 hierarchy or no nft")
    base = mount / f"sluice-test-{uuid.uuid4().hex[:6]}"
    a, b = base / "a", base / "b"
    for d in (a / "job-1.1", a / "faults", b):
        d.mkdir(parents=True)
    na, nb = node_net_v2("a", a, mount), node_net_v2("b", b, mount)
    try:
        if na.group is None:
            pytest.skip(f"no v2 egress accounting here: {na.missing}")
        assert na.job_group("job-1.1") is None  # nothing to join: the job's own group is counted
        assert na.table in _tables() and na.table != nb.table
        _send(str(a / "job-1.1" / "cgroup.procs"), 300)
        _send(str(a / "faults" / "cgroup.procs"), 100)  # something in node a that is not a job
        ca, cb = na.counters(), nb.counters()
        assert ca["job:job-1.1:net_tx_bytes"] == pytest.approx(300 * 1028)
        assert ca["net_tx_packets"] == 400 and ca["net_tx_bytes"] == pytest.approx(400 * 1028)
        assert ca["net_other_tx_packets"] == 100
        assert cb["net_tx_bytes"] == 0 and cb["net_other_tx_bytes"] == 0
        time.sleep(0.1)
        (a / "job-1.1").rmdir()
        na.drop_job("job-1.1")  # its rule goes at the next reading; its bytes stay the job's
        na.counters()
        after = na.counters()
        assert "job:job-1.1:net_tx_bytes" not in after
        assert after["net_tx_bytes"] == pytest.approx(400 * 1028) and after["net_other_tx_packets"] == 100
    finally:
        na.close()
        nb.close()
        time.sleep(0.1)
        for d in (a / "job-1.1", a / "faults", a, b, base):
            if d.exists():
                d.rmdir()
    assert na.table not in _tables() and nb.table not in _tables()


def test_v2_groups_count_what_a_job_receives_from_another_node_on_loopback(tmp_path: Path) -> None:
    """Ingress (`socket cgroupv2` on the input hook finds the receiving socket): 300 datagrams
    sent over loopback by something in node b (not a job) to a job of node a count as a's job's
    and a's ingress and b's "other" egress, and as nothing else — the two ends of one machine's
    loopback told apart. The job groups are made by the counters, as on a hybrid host."""
    mount = _v2_mount()
    if mount is None or shutil.which("nft") is None:
        pytest.skip("no writable cgroup v2 hierarchy or no nft")
    base = mount / f"sluice-test-{uuid.uuid4().hex[:6]}"
    a, b = base / "a", base / "b"
    for d in (a, b):
        d.mkdir(parents=True)
    na, nb = node_net_v2("a", a, mount, owns_jobs=True), node_net_v2("b", b, mount, owns_jobs=True)
    try:
        if na.group is None:
            pytest.skip(f"no v2 network accounting here: {na.missing}")
        job = na.job_group("job-1.1")
        assert job == str(a / "job-1.1" / "cgroup.procs") and nb.procs == str(b / "cgroup.procs")
        port = tmp_path / "port"
        recv = subprocess.Popen([sys.executable, "-c", _RECV, job, str(port), "300"])
        deadline = time.monotonic() + 20
        while not port.exists():
            assert time.monotonic() < deadline and recv.poll() is None, "the receiver never started"
            time.sleep(0.05)
        subprocess.run([sys.executable, "-c", _SEND_TO, nb.procs, port.read_text(), "300"], check=True, timeout=30)
        assert recv.wait(timeout=30) == 0
        ca, cb = na.counters(), nb.counters()
        assert ca["job:job-1.1:net_rx_bytes"] == pytest.approx(300 * 1028), ca
        assert ca["net_rx_packets"] == 300 and ca["net_other_rx_packets"] == 0
        assert ca["net_tx_packets"] == 0
        assert cb["net_tx_packets"] == 300 and cb["net_other_tx_bytes"] == pytest.approx(300 * 1028)
        assert cb["net_rx_packets"] == 0
        na.drop_job("job-1.1")  # the group goes now, its rules at the next reading, its bytes stay
        assert not (a / "job-1.1").exists()
        na.counters()
        after = na.counters()
        assert not any(k.startswith("job:") for k in after)
        assert after["net_rx_bytes"] == pytest.approx(300 * 1028) and after["net_other_rx_packets"] == 0
    finally:
        na.close()
        nb.close()
        time.sleep(0.1)
        for d in (a / "job-1.1", a, b, base):
            if d.exists():
                d.rmdir()
    assert na.table not in _tables() and nb.table not in _tables()
