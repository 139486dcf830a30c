"""Cgroup detection and limit files, on FAKE sysfs trees built in tmp_path.

The fake trees hold the files the kernel would show (cgroup.controllers, cpu.cfs_quota_us,
...); real kernel behaviour is checked in tests/integration/test_agent.py.
"""

from __future__ import annotations

from pathlib import Path

from sluice.agent.cgroup import (
    CgroupKind,
    CgroupLayout,
    CoreLedger,
    CpuController,
    JoinSpec,
    cgroup_name,
    detect_cgroups,
    split_cores,
)


def fake_v2(root: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def fake_v1(sysfs: Path, *, cpuacct: bool = True, cpuset: bool = True) -> None:
    cpu = sysfs / "cpu"
    cpu.mkdir(parents=True)
    for f, v in {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000", "cpu.shares": "1024"}.items():
        (cpu / f).write_text(v)
    if cpuacct:
        (sysfs / "cpuacct").mkdir()
        (sysfs / "cpuacct" / "cpuacct.usage").write_text("0")
    if cpuset:
        (sysfs / "cpuset").mkdir()
        (sysfs / "cpuset" / "cpuset.cpus").write_text("0-3\n")
        (sysfs / "cpuset" / "cpuset.mems").write_text("0\n")


def test_v2_with_cpu_controller_is_preferred_and_delegated(tmp_path: Path) -> None:
    fake_v2(tmp_path)
    fake_v1(tmp_path)
    layout = detect_cgroups(tmp_path, "sluice")
    assert layout.kind is CgroupKind.V2
    assert layout.cpu_parent == tmp_path / "sluice"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    assert (tmp_path / "sluice" / "cgroup.subtree_control").read_text() == "+cpu"


def test_hybrid_v2_without_cpu_falls_to_v1_with_separate_cpuacct(tmp_path: Path) -> None:
    fake_v2(tmp_path / "unified", controllers="")
    fake_v1(tmp_path)
    layout = detect_cgroups(tmp_path, "sluice-x")
    assert layout.kind is CgroupKind.V1
    assert layout.cpu_parent == tmp_path / "cpu" / "sluice-x"
    assert layout.cpuacct_parent == tmp_path / "cpuacct" / "sluice-x"
    assert layout.cpuset_parent is None, "cpusets only when virtual nodes ask for them"


def test_v1_cpuset_parent_gets_cpus_and_mems_copied_down(tmp_path: Path) -> None:
    fake_v1(tmp_path)
    layout = detect_cgroups(tmp_path, "sluice", cpuset=True)
    assert layout.cpuset_parent == tmp_path / "cpuset" / "sluice"
    # on a real kernel mkdir creates these files empty; the fake tree has none until written
    assert (layout.cpuset_parent / "cpuset.cpus").read_text() == "0-3"
    assert (layout.cpuset_parent / "cpuset.mems").read_text() == "0"


def test_nothing_mounted_means_affinity_with_a_reason(tmp_path: Path) -> None:
    layout = detect_cgroups(tmp_path / "empty", "sluice")
    assert layout.kind is CgroupKind.AFFINITY
    assert "no cgroup cpu controller" in layout.reason


def test_v2_without_cpu_and_no_v1_says_why(tmp_path: Path) -> None:
    fake_v2(tmp_path, controllers="memory pids")
    layout = detect_cgroups(tmp_path, "sluice")
    assert layout.kind is CgroupKind.AFFINITY
    assert "without the cpu controller" in layout.reason


def test_v1_controller_writes_quota_shares_and_lifts_the_limit(tmp_path: Path) -> None:
    fake_v1(tmp_path)
    layout = detect_cgroups(tmp_path, "sluice")
    ctrl = CpuController(layout, cgroup_name("job/1", 2), [0, 1])
    ctrl.create()
    assert ctrl.name == "job_1.2", "job ids are made safe as cgroup names"
    ctrl.apply(1.5, request_cores=0.5)
    d = tmp_path / "cpu" / "sluice" / "job_1.2"
    assert (d / "cpu.cfs_quota_us").read_text() == "150000"
    assert (d / "cpu.cfs_period_us").read_text() == "100000"
    assert (d / "cpu.shares").read_text() == "512"
    ctrl.apply(None, request_cores=2)
    assert (d / "cpu.cfs_quota_us").read_text() == "-1"
    assert (d / "cpu.shares").read_text() == "2048"
    ctrl.apply(0.001)
    assert (d / "cpu.cfs_quota_us").read_text() == "1000", "the kernel's 1 ms minimum"
    (tmp_path / "cpuacct" / "sluice" / "job_1.2" / "cpuacct.usage").write_text("2500000000")
    assert ctrl.usage_s() == 2.5
    assert ctrl.join_spec().procs_files == (
        str(d / "cgroup.procs"),
        str(tmp_path / "cpuacct/sluice/job_1.2/cgroup.procs"),
    )


def test_v2_controller_writes_cpu_max_and_weight(tmp_path: Path) -> None:
    fake_v2(tmp_path)
    layout = detect_cgroups(tmp_path, "sluice")
    ctrl = CpuController(layout, "j.1", [0, 1])
    ctrl.create()
    ctrl.apply(0.25, request_cores=1.0)
    d = tmp_path / "sluice" / "j.1"
    assert (d / "cpu.max").read_text() == "25000 100000"
    assert (d / "cpu.weight").read_text() == "100"
    ctrl.apply(None, request_cores=200)
    assert (d / "cpu.max").read_text() == "max 100000"
    assert (d / "cpu.weight").read_text() == "10000", "weight is capped at the kernel's maximum"
    (d / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\n")
    assert ctrl.usage_s() == 1.5


def test_affinity_fallback_pins_ceil_of_the_limit_and_spreads_jobs() -> None:
    layout = CgroupLayout(CgroupKind.AFFINITY, reason="test")
    ledger = CoreLedger((0, 1, 2, 3))
    a = CpuController(layout, "a.1", (0, 1, 2, 3), ledger=ledger)
    b = CpuController(layout, "b.1", (0, 1, 2, 3), ledger=ledger)
    a.apply(1.2)
    b.apply(0.5)
    assert a.join_spec().cpus == (0, 1)
    assert b.join_spec().cpus == (2,), "the second job goes to the least-used core"
    assert a.join_spec().procs_files == ()
    a.apply(None)
    assert a.join_spec().cpus == (0, 1, 2, 3)
    a.cleanup()
    assert "a.1" not in ledger.pinned


def test_join_spec_argv_and_core_splits() -> None:
    assert JoinSpec(("/x/cgroup.procs",), (0, 2)).to_argv() == ["--join", "/x/cgroup.procs", "--cpus", "0,2"]
    assert split_cores(2, [0, 1]) == [(0,), (1,)]
    assert split_cores(2, [0, 1, 2, 3, 4]) == [(0, 1, 2), (3, 4)]
    assert split_cores(3, [0, 1]) == [(0,), (1,), (0,)]
