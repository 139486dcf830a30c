"""Cgroup detection and limit files, on FAKE sysfs trees built in tmp_path.

The fake trees hold the files the kernel would show (cgroup.controllers, cpu.cfs_quota_us,
...); real kernel behaviour is checked in tests/integration/test_agent.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.agent.cgroup import (
    CgroupKind,
    CgroupLayout,
    CoreLedger,
    CpuController,
    JoinSpec,
    MemoryController,
    cgroup_name,
    detect_cgroups,
    detect_memory,
    split_cores,
)
from sluice.model import OomKill


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


def test_v2_delegates_cpuset_when_virtual_nodes_ask(tmp_path: Path) -> None:
    fake_v2(tmp_path)
    layout = detect_cgroups(tmp_path, "sluice", cpuset=True)
    assert layout.kind is CgroupKind.V2 and layout.cpuset_v2
    assert "cpuset" in (tmp_path / "sluice" / "cgroup.subtree_control").read_text()
    # Not asked for (one node), or no cpuset controller: none.
    assert not detect_cgroups(tmp_path, "other").cpuset_v2
    fake_v2(tmp_path / "nocs", controllers="cpu memory")
    assert not detect_cgroups(tmp_path / "nocs", "sluice", cpuset=True).cpuset_v2


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


# --------------------------------------------------------------------------- memory


def fake_v1_memory(sysfs: Path) -> Path:
    """A v1 memory hierarchy (in sysfs the kernel makes a cgroup's files on mkdir; the fakes
    below write the job cgroup's files themselves)."""
    mem = sysfs / "memory"
    mem.mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    return mem


def job_files(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (d / name).write_text(value)


def test_memory_v2_is_detected_and_delegated(tmp_path: Path) -> None:
    fake_v2(tmp_path)
    layout = detect_cgroups(tmp_path, "sluice")
    assert layout.memory_kind is CgroupKind.V2 and layout.memory_parent == tmp_path / "sluice"
    # A fake file keeps only the last write (the kernel's adds): delegate memory alone to see it.
    (tmp_path / "cgroup.subtree_control").write_text("")
    assert detect_memory(tmp_path, "other") == (CgroupKind.V2, tmp_path / "other", "")
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory"


def test_memory_v1_beside_an_empty_v2_mount(tmp_path: Path) -> None:
    fake_v2(tmp_path / "unified", controllers="")
    fake_v1(tmp_path)
    fake_v1_memory(tmp_path)
    layout = detect_cgroups(tmp_path, "sluice-m")
    assert layout.kind is CgroupKind.V1
    assert layout.memory_kind is CgroupKind.V1 and layout.memory_parent == tmp_path / "memory" / "sluice-m"
    assert (tmp_path / "memory" / "sluice-m").is_dir()


def test_no_memory_controller_says_why(tmp_path: Path) -> None:
    fake_v2(tmp_path / "unified", controllers="cpu")
    fake_v1(tmp_path)
    layout = detect_cgroups(tmp_path, "sluice")
    assert layout.kind is CgroupKind.V2  # CPU limits still work
    assert layout.memory_kind is None and layout.memory_parent is None
    assert "without the memory controller" in layout.memory_reason
    assert detect_cgroups(tmp_path / "empty", "sluice").memory_reason.startswith("no cgroup memory controller")


def test_v1_memory_limit_covers_swap_and_reads_the_oom_kill(tmp_path: Path) -> None:
    parent = tmp_path / "memory" / "sluice"
    layout = CgroupLayout(CgroupKind.V1, memory_kind=CgroupKind.V1, memory_parent=parent)
    d = parent / "j.1"
    job_files(d, {"memory.limit_in_bytes": "", "memory.memsw.limit_in_bytes": ""})
    mem = MemoryController(layout, "j.1", 64)
    mem.create()
    mem.apply()
    assert (d / "memory.limit_in_bytes").read_text() == str(64 * 1024 * 1024)
    assert (d / "memory.memsw.limit_in_bytes").read_text() == str(64 * 1024 * 1024)
    assert mem.procs_files() == (str(d / "cgroup.procs"),)
    job_files(d, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"})
    assert mem.oom(-9) is None  # no kill in the cgroup: some other SIGKILL
    job_files(
        d,
        {
            "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
            "memory.max_usage_in_bytes": str(64 * 1024 * 1024),
        },
    )
    oom = mem.oom(-9)
    assert oom == OomKill(64, 64 * 1024 * 1024)
    assert str(oom) == "OOMKilled: exceeded memory limit 64 MiB (peak 64 MiB)"
    assert mem.oom(0) is None  # a job that exits 0 was not ended by a child's OOM kill


def test_v1_without_an_oom_counter_needs_a_limit_hit_and_a_sigkill(tmp_path: Path) -> None:
    parent = tmp_path / "memory" / "sluice"
    layout = CgroupLayout(CgroupKind.V1, memory_kind=CgroupKind.V1, memory_parent=parent)
    job_files(parent / "j.1", {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n", "memory.failcnt": "3"})
    mem = MemoryController(layout, "j.1", 32)
    assert mem.oom(1) is None
    assert mem.oom(-9) == OomKill(32, None)
    assert str(OomKill(32, None)) == "OOMKilled: exceeded memory limit 32 MiB"


def test_v2_memory_max_no_swap_and_events(tmp_path: Path) -> None:
    parent = tmp_path / "sluice"
    layout = CgroupLayout(CgroupKind.V2, cpu_parent=parent, memory_kind=CgroupKind.V2, memory_parent=parent)
    d = parent / "j.2"
    job_files(d, {"memory.max": "max", "memory.swap.max": "max"})
    mem = MemoryController(layout, "j.2", 256)
    mem.apply()
    assert (d / "memory.max").read_text() == str(256 * 1024 * 1024)
    assert (d / "memory.swap.max").read_text() == "0"
    job_files(d, {"memory.events": "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n", "memory.peak": str(256 << 20)})
    assert str(mem.oom(-9)) == "OOMKilled: exceeded memory limit 256 MiB (peak 256 MiB)"


def test_a_memory_controller_needs_a_memory_layout() -> None:
    with pytest.raises(ValueError, match=r"resources\.memory_mb"):
        MemoryController(CgroupLayout(CgroupKind.AFFINITY), "j.1", 64)
