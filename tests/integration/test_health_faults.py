"""Fault injection and KPI sampling with real processes and real /proc counters."""

from __future__ import annotations

import math
import os
import shutil
import time
from collections import namedtuple
from pathlib import Path

import psutil
import pytest

from sluice.agent.cgroup import remove_root
from sluice.agent.faults import Fault, FaultKind, inject
from sluice.agent.kpi import KpiSampler
from sluice.model import JobProgress
from tests.fake_clock import FakeClock

pytestmark = [pytest.mark.integration, pytest.mark.serial]

CORE = [max(os.sched_getaffinity(0))]


def test_kpi_sampler_reports_rates_per_core_and_keeps_a_bounded_window() -> None:
    clock = FakeClock()
    k = KpiSampler(CORE, window_size=3, gpus=False, clock=clock)
    k.observe([JobProgress("j", 1, 0.0, 10), JobProgress("j", 1, 0.1, 30)])
    for _ in range(5):
        clock.advance(1.0)
        values = k.sample(jobs=1)
    for key in (
        "cpu0_busy_pct",
        "cpu_busy_pct",
        "cpu_iowait_pct",
        "cpu_steal_pct",
        "load1_per_core",
        "mem_used_pct",
        "swap_used_pct",
        "disk_write_mbps",
        "net_rx_mbps",
        "ctx_switches_ps",
        "jobs",
    ):
        assert key in values, key
    assert all(v == v and v >= 0 for v in values.values())  # finite, non-negative
    assert 0 <= values["cpu_busy_pct"] <= 100
    assert "cpu1_busy_pct" not in values  # only this node's core
    assert len(k.window) == 3
    assert [t for t, _ in k.window] == [clock.now - 2, clock.now - 1, clock.now]  # the newest three


def test_job_throughput_counts_reported_steps() -> None:
    clock = FakeClock()
    k = KpiSampler(CORE, gpus=False, clock=clock)
    k.observe([JobProgress("j", 1, 0.0, 10)])
    k.observe([JobProgress("j", 1, 0.5, 60)])
    clock.advance(2.0)
    assert k.sample()["job_steps_ps"] == pytest.approx(50 / 2.0)  # 50 steps in the 2 s since the last sample
    clock.advance(2.0)
    assert k.sample()["job_steps_ps"] == 0  # counted once


def test_job_throughput_per_job_is_logged_so_the_job_mix_does_not_dominate() -> None:
    clock = FakeClock()
    k = KpiSampler(CORE, gpus=False, clock=clock)
    k.observe([JobProgress("fast", 1, 0.0, 0), JobProgress("slow", 1, 0.0, 0)])
    k.observe([JobProgress("fast", 1, 0.5, 1000), JobProgress("slow", 1, 0.5, 10)])
    clock.advance(1.0)
    v = k.sample(jobs=2)
    assert v["jobs"] == 2
    assert v["job_steps_ps"] == pytest.approx(1010.0)
    assert v["job_steps_log_per_job"] == pytest.approx(math.log1p(1010.0 / 2))
    assert k.sample(jobs=0)["job_steps_log_per_job"] == 0.0


def test_cpu_fault_is_pinned_to_the_node_cores_and_killed_on_stop() -> None:
    with Fault(FaultKind.CPU, CORE, workers=2, use_stress_ng=False) as f:
        assert len(f.procs) == 2
        for p in f.procs:
            assert psutil.Process(p.pid).cpu_affinity() == CORE
        pids = [p.pid for p in f.procs]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids)


def test_memory_fault_holds_the_memory_it_was_asked_for() -> None:
    with Fault(FaultKind.MEMORY, CORE, memory_mb=64, use_stress_ng=False) as f:
        proc = psutil.Process(f.procs[0].pid)
        deadline = time.monotonic() + 30
        while proc.memory_info().rss < 60 * 1024 * 1024 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.memory_info().rss >= 60 * 1024 * 1024


def test_io_fault_writes_into_its_folder(tmp_path: Path) -> None:
    with Fault(FaultKind.IO, CORE, workdir=str(tmp_path), use_stress_ng=False):
        deadline = time.monotonic() + 30
        while not any(tmp_path.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any(p.name.startswith("io-") for p in tmp_path.iterdir())


@pytest.mark.skipif(shutil.which("stress-ng") is None, reason="stress-ng not installed (scripts/setup.sh installs it)")
def test_stress_ng_fault_runs_with_taskset_and_stops() -> None:
    f = inject("cpu", CORE)
    try:
        assert "--taskset" in f.argvs()[0]
        time.sleep(0.5)
        assert f.running
    finally:
        f.stop()
    assert not f.running


def test_unknown_fault_kind_is_named() -> None:
    with pytest.raises(ValueError, match="'fire' is not one of cpu, memory, io"):
        inject("fire", CORE)


def test_peer_excess_is_what_the_node_cores_do_beyond_the_other_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake of psutil's per-core counters: a lasting asymmetry between the cores of a shared
    machine cannot be made to order while other work runs on it."""
    Times = namedtuple("Times", "user nice system idle iowait steal")
    state = {"t": 0}

    def cpu_times(percpu: bool = False) -> list[Times]:
        n = state["t"]
        # core 0 (a peer): 20% system; core 1 (the node): 50% system, per 100 ticks.
        return [Times(0, 0, 20 * n, 80 * n, 0, 0), Times(0, 0, 50 * n, 50 * n, 0, 0)]

    monkeypatch.setattr(psutil, "cpu_times", cpu_times)
    k = KpiSampler([1], gpus=False)
    state["t"] = 1
    v = k.sample()
    assert v["cpu_system_pct"] == pytest.approx(50) and v["peer_excess_cpu_system_pct"] == pytest.approx(30)
    assert v["peer_excess_cpu_busy_pct"] == pytest.approx(30)
    peer = KpiSampler([0], gpus=False)  # the quieter core sees no excess, not a negative one
    state["t"] = 2
    assert peer.sample()["peer_excess_cpu_system_pct"] == 0.0


def test_a_fault_in_one_node_cgroup_is_seen_there_and_not_in_its_sibling(tmp_path: Path) -> None:
    """Two nodes' own cgroups on the real kernel; a CPU hog and then an I/O storm are started
    inside node b's groups (as its agent starts `sluice node fault`): b's node_* KPIs show
    them, a's stay quiet — whatever else the shared machine is doing."""
    import uuid

    from sluice.agent.cgroup import detect_cgroups
    from sluice.agent.node_cgroup import node_groups, remove_groups

    root = f"sluice-test-{uuid.uuid4().hex[:6]}"
    layout = detect_cgroups(root=root)
    a, b = (node_groups(layout, name, root=root) for name in ("a", "b"))
    if b.usage is None:
        pytest.skip(f"no writable cgroup CPU accounting here: {b.missing}")
    samplers = {g.node: KpiSampler(CORE, gpus=False, groups=g, memory_mb=4096) for g in (a, b)}

    def sample(seconds: float = 2.0) -> dict[str, dict[str, float]]:
        for s in samplers.values():
            s.sample()
        time.sleep(seconds)
        return {n: s.sample() for n, s in samplers.items()}

    def joined(fault: Fault) -> None:
        """Wait until the launcher has put every fault process in b's groups (its first act):
        each group it joins (on v2 the `faults` leaf below b: an inner group holds no tasks)."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if fault.join and all(
                {str(p.pid) for p in fault.procs} <= set(Path(f).read_text().split()) for f in fault.join
            ):
                return
            time.sleep(0.05)
        raise AssertionError(f"fault processes never joined {fault.join}")

    try:
        with Fault(FaultKind.CPU, CORE, use_stress_ng=False, join=b.fault_join()) as hog:
            joined(hog)
            kpis = sample()
        assert kpis["b"]["node_cpu_other_pct"] > 20.0, kpis["b"]
        assert kpis["a"]["node_cpu_other_pct"] < 2.0 and kpis["a"]["node_cpu_used_pct"] < 2.0, kpis["a"]
        if b.blkio is not None or "node_io_write_mbps" in kpis["b"]:
            with Fault(FaultKind.IO, CORE, use_stress_ng=False, join=b.fault_join(), workdir=str(tmp_path)) as storm:
                joined(storm)
                kpis = sample()
            assert kpis["b"]["node_io_write_mbps"] > 1.0, kpis["b"]
            assert kpis["a"]["node_io_write_mbps"] == 0.0, kpis["a"]
    finally:
        time.sleep(0.2)  # the kernel drops a killed task from its cgroup a moment later
        for g in (a, b):
            remove_groups(g)
        remove_root(root)


def test_a_closed_nodes_empty_groups_and_cpuset_are_removed_and_busy_ones_kept() -> None:
    """The node's groups and its cpuset on the real kernel: an agent that closes removes what
    is empty and keeps a group a job still runs in (for the next agent to adopt)."""
    import subprocess
    import uuid

    from sluice.agent.cgroup import detect_cgroups, node_cpuset
    from sluice.agent.node_cgroup import node_groups, remove_groups

    root = f"sluice-test-{uuid.uuid4().hex[:6]}"
    layout = detect_cgroups(root=root, cpuset=True)
    cpuset = node_cpuset(layout, "n", CORE)
    if cpuset is None:
        remove_root(root)  # detect_cgroups made it
        pytest.skip(f"no writable v1 cpuset here: {layout.reason}")
    g = node_groups(layout, "n", root=root)
    job = subprocess.Popen(["sleep", "30"])
    try:
        (cpuset / "cgroup.procs").write_text(str(job.pid))
        remove_groups(g, cpuset)
        assert cpuset.is_dir(), "a cpuset a process still runs in must stay"
        job.kill()
        job.wait()
        time.sleep(0.2)  # the kernel drops a killed task from its cgroup a moment later
        remove_groups(g, cpuset)
        assert not cpuset.exists()
        assert g.usage is None or not g.usage.exists()
    finally:
        job.kill()
        job.wait()
        remove_root(root)
