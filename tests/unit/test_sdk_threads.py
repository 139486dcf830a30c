"""The SDK's view of its own CPU budget, on fake /proc and cgroup trees of each flavour."""

from __future__ import annotations

import sys
import threading
import types
from pathlib import Path

import pytest

from sluice.sdk._threads import CpuBudget, ThreadSync, find_cpu_cgroup, read_quota
from sluice.spec import JobSpec


def _proc(tmp: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return proc


def _v1_tree(tmp: Path) -> tuple[Path, Path]:
    mount = tmp / "sys fs" / "cpu,cpuacct"
    leaf = mount / "sluice" / "job.1"
    leaf.mkdir(parents=True)
    for d, quota in ((mount, -1), (mount / "sluice", 300_000), (leaf, 150_000)):
        (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (d / "cpu.cfs_period_us").write_text("100000\n")
    info = f"30 25 0:27 / {str(mount).replace(' ', chr(92) + '040')} rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
    return _proc(tmp, "4:memory:/x\n2:cpu,cpuacct:/sluice/job.1\n0::/\n", info), leaf


def test_v1_quota_is_the_tightest_on_the_way_up(tmp_path: Path) -> None:
    proc, leaf = _v1_tree(tmp_path)
    found = find_cpu_cgroup(proc)
    assert found == ("v1", leaf, leaf.parent.parent)
    assert read_quota(*found) == 1.5
    (leaf / "cpu.cfs_quota_us").write_text("-1\n")  # lifted here: the parent's 3 cores rule
    assert read_quota(*found) == 3.0


def test_v2_under_a_namespaced_root(tmp_path: Path) -> None:
    mount = tmp_path / "unified"
    leaf = mount / "job.2"
    leaf.mkdir(parents=True)
    (leaf / "cpu.max").write_text("50000 100000\n")
    # the mount shows the hierarchy from /sluice down, as a container's cgroup namespace does
    proc = _proc(tmp_path, "0::/sluice/job.2\n", f"40 1 0:30 /sluice {mount} rw - cgroup2 cgroup2 rw\n")
    found = find_cpu_cgroup(proc)
    assert found == ("v2", leaf, mount)
    assert read_quota(*found) == 0.5
    (leaf / "cpu.max").write_text("max 100000\n")
    assert read_quota(*found) is None


def test_no_cgroup_degrades_to_affinity_with_the_reason(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "0::/\n", "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n")
    sync = ThreadSync(proc)
    b = sync.budget()
    assert b.quota_cores is None and "not mounted" in b.source and b.threads == b.affinity >= 1
    assert "cannot read" in str(find_cpu_cgroup(tmp_path / "nothing"))


@pytest.mark.parametrize(
    ("quota", "affinity", "threads"), [(None, 4, 4), (0.25, 4, 1), (1.4, 4, 1), (1.5, 4, 2), (8.0, 2, 2)]
)
def test_thread_count_rounds_the_quota_within_the_affinity(quota: float | None, affinity: int, threads: int) -> None:
    assert CpuBudget(quota, affinity, "").threads == threads


def test_sync_resizes_torch_and_hooks_only_on_a_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, leaf = _v1_tree(tmp_path)
    monkeypatch.setattr("sluice.sdk._threads._affinity", lambda: 8)
    calls: list[tuple[str, int]] = []
    fake = types.SimpleNamespace(set_num_threads=lambda n: calls.append(("torch", n)))
    monkeypatch.setitem(sys.modules, "torch", fake)
    sync = ThreadSync(proc)
    sync.hooks.append(lambda n: calls.append(("hook", n)))
    assert sync.maybe_sync(now=100.0) == 2  # 1.5 cores
    assert sync.maybe_sync(now=101.0) is None  # within the check interval: no file read
    (leaf / "cpu.cfs_quota_us").write_text("100000\n")  # a live cut to 1 core
    assert sync.maybe_sync(now=106.0) == 1
    assert sync.maybe_sync(now=112.0) is None  # unchanged: nothing called
    assert calls == [("torch", 2), ("hook", 2), ("torch", 1), ("hook", 1)]
    monkeypatch.setenv("SLUICE_THREADS", "manual")
    (leaf / "cpu.cfs_quota_us").write_text("-1\n")
    assert sync.maybe_sync(now=200.0) is None and calls[-1] == ("hook", 1)


def test_a_pool_is_never_grown_past_what_the_job_chose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, leaf = _v1_tree(tmp_path)
    (leaf / "cpu.cfs_quota_us").write_text("-1\n")  # no limit: the budget is the affinity
    monkeypatch.setattr("sluice.sdk._threads._affinity", lambda: 8)
    calls: list[int] = []
    fake = types.SimpleNamespace(get_num_threads=lambda: 1, set_num_threads=calls.append)
    monkeypatch.setitem(sys.modules, "torch", fake)
    sync = ThreadSync(proc)
    assert sync.sync() is None or calls == [1]  # a one-thread job stays at one thread
    assert all(n == 1 for n in calls)


def test_a_job_may_set_only_the_sdk_knobs_and_only_to_meaningful_values() -> None:
    JobSpec(command=["true"], env={"SLUICE_THREADS": "manual", "SLUICE_THREADS_CHECK_S": "0.5"})
    for env, word in (
        ({"SLUICE_THREADS": "sometimes"}, "SLUICE_THREADS"),
        ({"SLUICE_THREADS_CHECK_S": "soon"}, "SLUICE_THREADS_CHECK_S"),
        ({"SLUICE_CPU_MAX": "8"}, "set by sluice itself"),
    ):
        with pytest.raises(ValueError, match=word):
            JobSpec(command=["true"], env=env)


def _per_thread_torch(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A fake torch whose thread count is per thread (as OpenMP's is), default 4, on 8 CPUs."""
    monkeypatch.setattr("sluice.sdk._threads._affinity", lambda: 8)
    pools = threading.local()
    fake = types.SimpleNamespace(
        get_num_threads=lambda: getattr(pools, "n", 4), set_num_threads=lambda n: setattr(pools, "n", n)
    )
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def test_each_reporting_thread_has_its_own_pool_resized(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's intra-op count is per thread (OpenMP), as this fake's is. A side thread that
    reported first (a metrics or logging thread) took the check and the change for the whole
    process: the training thread's pool was never resized (sdkwalk, s32)."""
    proc, leaf = _v1_tree(tmp_path)  # 1.5 cores: 2 threads
    fake = _per_thread_torch(monkeypatch)
    sync = ThreadSync(proc)
    heard: list[int] = []
    sync.hooks.append(heard.append)

    def side(now: float) -> None:
        sync.maybe_sync(now=now)
        heard.append(-fake.get_num_threads())

    def in_side(now: float) -> None:
        t = threading.Thread(target=side, args=(now,))
        t.start()
        t.join()

    in_side(100.0)
    assert sync.maybe_sync(now=100.5) == 2  # the training thread, within the side thread's interval
    assert fake.get_num_threads() == 2
    (leaf / "cpu.cfs_quota_us").write_text("100000\n")  # a live cut to 1 core
    assert sync.maybe_sync(now=106.0) == 1 and fake.get_num_threads() == 1
    assert heard == [2, -2, 1]  # hooks once per change, whichever thread saw it


def test_hooks_hear_one_count_when_threads_with_different_pools_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training thread chose 1 torch thread, a side thread has torch's default 4; the
    budget is 2. Each thread's pool is its own, but the hooks (threadpoolctl, TensorFlow: one
    setting for the process) heard 1, then 2, then 1 ... at every check of either thread, the
    job's own choice undone every few seconds (redteam32, s32)."""
    proc, _leaf = _v1_tree(tmp_path)  # 1.5 cores: 2 threads
    fake = _per_thread_torch(monkeypatch)
    fake.set_num_threads(1)  # the training (this) thread's own choice
    sync = ThreadSync(proc)
    heard: list[int] = []
    sync.hooks.append(heard.append)
    side = threading.Thread(target=lambda: [sync.maybe_sync(now=t) for t in (100.0, 106.0, 112.0)])
    sync.maybe_sync(now=99.0)
    side.start()
    side.join()
    for t in (105.0, 111.0, 117.0):
        sync.maybe_sync(now=t)
    assert fake.get_num_threads() == 1
    assert heard == [1]
