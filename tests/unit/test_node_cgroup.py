"""A node's own cgroups and the node_* KPIs read from them, on FAKE sysfs trees in tmp_path.

The real kernel (a fault on one virtual node seen in its counters and not the other's) is
checked in tests/integration/test_health_faults.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sluice.agent.cgroup import CgroupKind, CgroupLayout, detect_cgroups
from sluice.agent.kpi import node_rates
from sluice.agent.node_cgroup import ACCOUNTING_BPS, FAULT_LEAF, group_dirs, node_groups, read_counters

from .test_cgroup import fake_v1, fake_v1_memory, fake_v2


def fake_block(tmp_path: Path) -> Path:
    sys_block = tmp_path / "sys-block"
    for name, dev in (("vda", "254:0"), ("loop0", "7:0")):
        (sys_block / name).mkdir(parents=True)
        (sys_block / name / "dev").write_text(dev + "\n")
    return sys_block


def hybrid(tmp_path: Path) -> Path:
    """v1 cpu, cpuacct, cpuset, memory, blkio, and an empty v2 mount with PSI (this CI's kind)."""
    sysfs = tmp_path / "sysfs"
    fake_v1(sysfs)
    fake_v1_memory(sysfs)
    (sysfs / "blkio").mkdir()
    (sysfs / "blkio" / "blkio.throttle.io_service_bytes").write_text("Total 0\n")
    fake_v2(sysfs / "unified", controllers="")
    (sysfs / "unified" / "cpu.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    return sysfs


def test_v1_node_groups_hold_the_jobs_and_faults_of_the_node(tmp_path: Path) -> None:
    sysfs = hybrid(tmp_path)
    layout = detect_cgroups(sysfs, "sluice", cpuset=True)
    g = node_groups(layout, "node-1", sysfs, None, fake_block(tmp_path))  # root: where layout put jobs
    # Job cgroups are made inside the node's groups, so the node's counters include its jobs.
    assert g.layout.cpu_parent == sysfs / "cpu" / "sluice" / "node-1"
    assert g.layout.cpuacct_parent == g.usage == sysfs / "cpuacct" / "sluice" / "node-1"
    assert g.layout.memory_parent == g.memory == sysfs / "memory" / "sluice" / "node-1"
    assert g.blkio == sysfs / "blkio" / "sluice" / "node-1"
    assert g.unified == sysfs / "unified" / "sluice" / "node-1"
    # Block I/O accounting: a rule far above any device's speed on each real device (no loop).
    assert (g.blkio / "blkio.throttle.write_bps_device").read_text() == f"254:0 {ACCOUNTING_BPS}"
    # A job joins the groups it has none of its own in; without a memory limit, the node's.
    assert g.job_join(has_memory_cgroup=False) == tuple(str(d / "cgroup.procs") for d in (g.blkio, g.unified, g.memory))
    assert str(g.memory / "cgroup.procs") not in g.job_join(has_memory_cgroup=True)
    cpuset = sysfs / "cpuset" / "sluice" / "node-1"
    assert set(g.fault_join(cpuset)) == {
        str(d / "cgroup.procs") for d in (g.layout.cpu_parent, g.usage, g.memory, g.blkio, g.unified, cpuset)
    }
    assert g.missing == ("node pressure (PSI): no cgroup v2 group with *.pressure files (kernel PSI off?)",), (
        "a fake tree's new group has no files; a kernel's has"
    )


def test_v2_faults_go_to_a_leaf_because_inner_groups_hold_no_processes(tmp_path: Path) -> None:
    sysfs = fake_v2(tmp_path / "sysfs")
    layout = detect_cgroups(sysfs, "sluice")
    g = node_groups(layout, "n0", sysfs, "sluice", fake_block(tmp_path))
    node = sysfs / "sluice" / "n0"
    assert g.layout.cpu_parent == g.usage == g.memory == g.unified == node
    assert g.usage_kind is CgroupKind.V2
    assert g.fault_leaf == node / FAULT_LEAF
    assert g.fault_join() == (str(node / FAULT_LEAF / "cgroup.procs"),)
    assert g.job_join(has_memory_cgroup=False) == (), "on v2 a job's own group is inside the node already"
    assert (node / "cgroup.subtree_control").read_text().startswith("+"), "controllers delegated below the node"


def test_a_v2_virtual_nodes_group_holds_its_cores(tmp_path: Path) -> None:
    """On a v2-only host a virtual node's jobs were kept to its cores by affinity alone, which a
    job may reset (the attack: tests/integration/test_local_engine.py); the node's group now
    holds them as a cpuset that its jobs and faults inherit. The first cut wrote each job's
    own group and failed on a real v2 kernel (cpuset not delegated below the node: EACCES)."""
    sysfs = fake_v2(tmp_path / "sysfs")
    layout = detect_cgroups(sysfs, "sluice", cpuset=True)
    block = fake_block(tmp_path)
    g = node_groups(layout, "n0", sysfs, "sluice", block, cpus=[2, 3])
    assert (sysfs / "sluice" / "n0" / "cpuset.cpus").read_text() == "2,3"
    assert not any("cpuset" in m for m in g.missing)
    whole = node_groups(layout, "n1", sysfs, "sluice", block)  # not a virtual node
    assert not (sysfs / "sluice" / "n1" / "cpuset.cpus").exists() and whole.usage is not None


def test_a_cpuset_that_cannot_be_written_is_named_not_raised(tmp_path: Path) -> None:
    sysfs = fake_v2(tmp_path / "sysfs")
    layout = detect_cgroups(sysfs, "sluice", cpuset=True)
    (sysfs / "sluice" / "n0" / "cpuset.cpus").mkdir(parents=True)  # a write there fails
    g = node_groups(layout, "n0", sysfs, "sluice", fake_block(tmp_path), cpus=[1])
    assert any(m.startswith("node cpuset: cannot write") for m in g.missing), g.missing
    assert g.usage is not None, "the rest of the node's groups stand"


def test_no_cgroups_degrades_with_a_reason_per_kpi_family(tmp_path: Path) -> None:
    g = node_groups(CgroupLayout(CgroupKind.AFFINITY, reason="read-only"), "n0", tmp_path / "none", "sluice")
    assert g.usage is None and g.memory is None and g.blkio is None
    text = " ".join(g.missing)
    for family in ("node CPU usage", "node memory", "node block I/O", "node pressure"):
        assert family in text
    assert read_counters(g) == {}


def write(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (d / name).write_text(value)


def test_counters_become_node_kpis_and_what_is_not_a_job_is_named(tmp_path: Path) -> None:
    sysfs = hybrid(tmp_path)
    g = node_groups(detect_cgroups(sysfs, "sluice"), "n1", sysfs, "sluice", fake_block(tmp_path))
    assert g.usage is not None and g.memory is not None and g.blkio is not None and g.unified is not None

    def state(node_ns: int, job_ns: int, sys_ns: int, wbytes: int, psi_io_us: int) -> dict[str, float]:
        write(g.usage, {"cpuacct.usage": str(node_ns), "cpuacct.usage_sys": str(sys_ns)})
        write(g.usage / "job-a.1", {"cpuacct.usage": str(job_ns)})
        write(g.memory, {"memory.usage_in_bytes": str(512 << 20), "memory.stat": "total_pgmajfault 3\n"})
        write(g.blkio, {"blkio.throttle.io_service_bytes_recursive": f"254:0 Write {wbytes}\nTotal {wbytes}\n"})
        write(g.blkio, {"blkio.throttle.io_serviced_recursive": "254:0 Total 10\nTotal 10\n"})
        psi = f"some avg10=0 avg60=0 avg300=0 total={psi_io_us}\nfull avg10=0 avg60=0 avg300=0 total=0\n"
        write(g.unified, {"io.pressure": psi})
        return read_counters(g)

    before = state(0, 0, 0, 0, 0)
    # One second later: 1.5 cores used in the node, 0.5 of them by its job, 0.25 in the kernel.
    after = state(1_500_000_000, 500_000_000, 250_000_000, 64 << 20, 400_000)
    kpis = node_rates(after, before, 1.0, cores=2, memory_mb=2048, last_other=0.0)
    assert kpis["node_cpu_used_pct"] == pytest.approx(75.0)
    assert kpis["node_cpu_other_pct"] == pytest.approx(50.0), "a core busy with something that is no job"
    assert kpis["node_cpu_system_pct"] == pytest.approx(12.5)
    assert kpis["node_mem_used_pct"] == pytest.approx(25.0)
    assert kpis["node_io_write_mbps"] == pytest.approx(64.0)
    assert kpis["node_psi_io_pct"] == pytest.approx(40.0)
    # A job whose cgroup vanished took its last slice with it: the sample repeats the last value.
    gone = {k: v for k, v in after.items() if not k.startswith("job:")}
    gone["cpu_s"] += 1.0
    assert node_rates(gone, after, 1.0, 2, 2048, last_other=7.0)["node_cpu_other_pct"] == 7.0


def test_net_counters_become_egress_and_ingress_rates_and_other_is_the_node_groups_own() -> None:
    """The node's total egress (node rule + job rules) and the part not sent by jobs (node
    rule alone) as rates; no net counters (no nft / net_cls): no network KPIs at all."""
    prev = {"net_tx_bytes": 0.0, "net_tx_packets": 0.0, "net_other_tx_bytes": 0.0, "net_other_tx_packets": 0.0}
    cur = {"net_tx_bytes": 8 * 1048576.0, "net_tx_packets": 400.0, "net_other_tx_bytes": 2 * 1048576.0}
    out = node_rates({**prev, **cur}, prev, 2.0, 1, 1024.0, 0.0)
    assert out["node_net_tx_mbps"] == pytest.approx(4.0)
    assert out["node_net_tx_pps"] == pytest.approx(200.0)
    assert out["node_net_other_tx_mbps"] == pytest.approx(1.0)
    assert not any(k.startswith("node_net_rx") or "_rx_" in k for k in out)  # v1: egress only
    assert not any(k.startswith("node_net") for k in node_rates({"cpu_s": 1.0}, {"cpu_s": 0.0}, 1.0, 1, 1024.0, 0.0))
    # v2 groups also count what was received
    rx_prev = {**prev, "net_rx_bytes": 0.0, "net_rx_packets": 0.0, "net_other_rx_bytes": 0.0}
    rx_cur = {**cur, "net_rx_bytes": 6 * 1048576.0, "net_rx_packets": 100.0, "net_other_rx_bytes": 4 * 1048576.0}
    out = node_rates(rx_cur, rx_prev, 2.0, 1, 1024.0, 0.0)
    assert out["node_net_rx_mbps"] == pytest.approx(3.0) and out["node_net_rx_pps"] == pytest.approx(50.0)
    assert out["node_net_other_rx_mbps"] == pytest.approx(2.0)


def test_the_network_is_counted_by_a_v2_group_where_the_node_has_one_and_by_net_cls_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which network accounting the node gets (the counting itself is checked on the real
    kernel in tests/integration/test_node_net.py). The fake tree stands in for /sys/fs/cgroup:
    a v2-only host counts by the node's usage group; a hybrid host by its `unified` group, with
    job groups the counters make (ingress too); net_cls (egress only) where that fails."""
    import sluice.agent.node_cgroup as nc
    from sluice.agent.node_net import NodeNet, NodeNetV2

    calls: list[tuple[str, ...]] = []
    v2_fails = False

    def v2(node: str, group: Path, mount: Path, owns_jobs: bool = False) -> NodeNetV2:
        calls.append(("v2", node, str(group), str(mount), str(owns_jobs)))
        if v2_fails:
            return NodeNetV2(node, missing="nft cannot add a `socket cgroupv2` rule")
        return NodeNetV2(node, group, mount, "t", "nft", owns_jobs=owns_jobs)

    def v1(node: str, root: str, sysfs: Path) -> NodeNet:
        calls.append(("v1", node, root))
        return NodeNet(node, group=sysfs / "net_cls" / root / node)

    monkeypatch.setattr(nc, "node_net_v2", v2)
    monkeypatch.setattr(nc, "node_net", v1)
    block = fake_block(tmp_path)
    sysfs = fake_v2(tmp_path / "v2")
    monkeypatch.setattr(nc, "SYSFS_CGROUP", sysfs)
    g = node_groups(detect_cgroups(sysfs, "sluice"), "n0", sysfs, "sluice", block)
    assert calls == [("v2", "n0", str(sysfs / "sluice" / "n0"), str(sysfs), "False")]
    assert isinstance(g.net, NodeNetV2) and g.net.procs is None
    assert g.fault_join() == (str(sysfs / "sluice" / "n0" / FAULT_LEAF / "cgroup.procs"),), "no group to join"
    assert not any("network" in m for m in g.missing)

    calls.clear()
    sysfs = hybrid(tmp_path)
    unified = sysfs / "unified" / "sluice" / "n1"
    monkeypatch.setattr(nc, "SYSFS_CGROUP", sysfs)
    g = node_groups(detect_cgroups(sysfs, "sluice", cpuset=True), "n1", sysfs, None, block)
    assert calls == [("v2", "n1", str(unified), str(sysfs / "unified"), "True")]
    assert isinstance(g.net, NodeNetV2) and g.net.procs == str(unified / "cgroup.procs")
    assert str(unified / "cgroup.procs") in g.fault_join()  # a fault is the node's "other" traffic
    # A job joins the node's unified group, then (last, so it ends up there) its own child.
    joined = [*g.job_join(has_memory_cgroup=False), str(unified / "job-1.1" / "cgroup.procs")]
    assert joined.index(str(unified / "cgroup.procs")) < joined.index(str(unified / "job-1.1" / "cgroup.procs"))

    calls.clear()
    v2_fails = True
    g = node_groups(detect_cgroups(sysfs, "sluice", cpuset=True), "n2", sysfs, None, block)
    assert calls == [
        ("v2", "n2", str(sysfs / "unified" / "sluice" / "n2"), str(sysfs / "unified"), "True"),
        ("v1", "n2", "sluice"),
    ]
    assert isinstance(g.net, NodeNet) and str(sysfs / "net_cls" / "sluice" / "n2" / "cgroup.procs") in g.fault_join()
    assert any(m.startswith("node network ingress: counted on cgroup v2 only") for m in g.missing), g.missing


def test_the_dirs_recorded_for_a_node_are_its_own_never_a_shared_root(tmp_path: Path) -> None:
    """What `node_owners` may remove after a killed agent: the node's groups in each hierarchy
    (and its faults leaf and cpuset), never the root other nodes' groups sit in — not even
    for a node named like the root, nor where a hierarchy had no node group."""
    sysfs = hybrid(tmp_path)
    layout = detect_cgroups(sysfs, "sluice", cpuset=True)
    block = fake_block(tmp_path)
    g = node_groups(layout, "node-1", sysfs, None, block)
    cpuset = sysfs / "cpuset" / "sluice" / "node-1"
    assert set(group_dirs(g, layout, cpuset)) == {
        sysfs / h / "sluice" / "node-1" for h in ("cpu", "cpuacct", "memory", "blkio", "unified", "cpuset")
    }
    same = node_groups(layout, "sluice", sysfs, None, block)
    assert all(d.parent.name == "sluice" and d.name == "sluice" for d in group_dirs(same, layout))
    for node in (g, same):  # as when the node's cpu and memory groups failed: jobs use the root
        unscoped = replace(node, layout=layout, memory=None)
        assert layout.memory_parent not in group_dirs(unscoped, layout)
        assert layout.cpu_parent not in group_dirs(unscoped, layout)
