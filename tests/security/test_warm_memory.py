"""A dataset warm under isolation runs a helper of the tenant's uid that holds up to `workers`
items in memory at once, whole, and the tenant chooses how big its items are (each up to
1 TiB). Red team s26: the helper ran in no memory cgroup, so one warm of a dataset with a
huge file could take the node's memory. It now runs in a memory cgroup of `warm_memory_mb`
(default a quarter of RAM), made before it is sent its request; past it the warm fails, and
says why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sluice.agent.cgroup import MemoryController
from sluice.agent.node_agent import NodeAgent
from sluice.agent.tenant_cache import _ENTER as ENTER
from sluice.agent.tenant_cache import TenantCacheError, run_helper
from sluice.data.settings import CacheSettings
from sluice.model import JobUser
from sluice.settings import Settings
from tests.integration.conftest import remove_cgroups
from tests.isolating import needs_root

CAROL = JobUser(231_301, 231_301)


@needs_root
def test_a_warm_past_its_memory_limit_is_killed_and_says_so(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "small.bin").write_bytes(b"x" * 1000)
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        home=tmp_path / "home", cgroup_root=cgroup_root, warm_memory_mb=256, dataset_roots=[str(tmp_path)]
    )
    settings.home.mkdir(mode=0o711)
    cache = CacheSettings(disk_dir=tmp_path / "disk", memory_dir=tmp_path / "memory", memory_bytes=64 << 20)
    agent = NodeAgent("n0", settings.runs_dir, settings=settings, cache=cache)  # the jail: 256 + 64 MiB
    try:
        parent = agent.layout.memory_parent
        if parent is None:
            pytest.skip(f"no cgroup memory controller here ({agent.layout.reason})")
        ok = agent.warm_dataset("carol/small", str(src), run_as=CAROL)
        assert ok.error is None and ok.files_fetched == 1, ok  # a warm within its limit works
        with open(src / "big.bin", "wb") as f:
            f.truncate(700 << 20)  # sparse: no disk, but 700 MiB of bytes once read
        big = agent.warm_dataset("carol/big", str(src), workers=1, run_as=CAROL)
        assert big.error is not None and "memory limit of 320 MiB" in big.error, big
        assert not [d for d in parent.iterdir() if d.name.startswith("sluice-warm-")]  # each jail removed
    finally:
        agent.close()
        remove_cgroups(cgroup_root)


@needs_root
def test_a_warm_within_its_share_of_the_memory_tier_is_not_killed_for_it(tmp_path: Path) -> None:
    # Red team s27: the memory tier is tmpfs, and what a warm writes there is charged to the
    # memory cgroup of the process that writes it: the helper's jail. The jail held the
    # helper's own memory to warm_memory_mb and its share of the memory tier too, so a warm
    # that filled its share (by default a quarter of RAM, as the jail) was always killed.
    src = tmp_path / "src"
    src.mkdir()
    for i in range(60):
        (src / f"f{i:03}.bin").write_bytes(os.urandom(2 << 20))  # 120 MiB, 2 MiB items
    shm = Path(f"/dev/shm/sluice-test-{uuid.uuid4().hex[:8]}")
    cache = CacheSettings(disk_dir=tmp_path / "disk", memory_dir=shm, memory_bytes=110 << 20)
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        home=tmp_path / "home", cgroup_root=cgroup_root, warm_memory_mb=128, dataset_roots=[str(tmp_path)]
    )
    settings.home.mkdir(mode=0o711)
    agent = NodeAgent("n0", settings.runs_dir, settings=settings, cache=cache)
    try:
        if agent.layout.memory_parent is None:
            pytest.skip(f"no cgroup memory controller here ({agent.layout.reason})")
        if os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize < 256 << 20:
            pytest.skip("/dev/shm has under 256 MiB free")
        report = agent.warm_dataset("carol/many", str(src), workers=1, run_as=CAROL)
        assert report.error is None and report.files_fetched == 60, report
    finally:
        agent.close()
        remove_cgroups(cgroup_root)
        shutil.rmtree(shm, ignore_errors=True)


def _jail(tmp_path: Path, cgroup_root: str) -> tuple[NodeAgent, MemoryController]:
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root)
    settings.home.mkdir(mode=0o711)
    agent = NodeAgent("n0", settings.runs_dir, settings=settings)
    if agent.layout.memory_parent is None:
        agent.close()
        pytest.skip(f"no cgroup memory controller here ({agent.layout.reason})")
    jail = MemoryController(agent.layout, f"sluice-warm-test-{uuid.uuid4().hex[:6]}", 128)
    return agent, jail


@needs_root
def test_the_warm_helper_is_in_its_jail_and_the_tenants_from_its_first_instruction(tmp_path: Path) -> None:
    """Red team s27 (seen, not shown): the helper ran as the tenant's uid for a moment before
    the agent moved it into its jail, and a job of the same uid that may trace it could make
    it fork outside. Now a launcher joins the jail as the plane and only then becomes the
    tenant and the helper. The `python` the helper runs is a script that writes down, as its
    very first act, its cgroups and uid: they are the jail's and the tenant's."""
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    agent, jail = _jail(tmp_path, cgroup_root)
    seen = tmp_path / "seen"
    seen.mkdir(mode=0o777)
    seen.chmod(0o777)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\n{{ id -u; cat /proc/self/cgroup; }} > {seen}/first\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    for p in (tmp_path, *tmp_path.parents):
        os.chmod(p, os.stat(p).st_mode | 0o001)  # the tenant must reach the wrapper
    try:
        with pytest.raises(TenantCacheError):  # an op the helper refuses: what it ran first is the point
            run_helper(CAROL, {"op": "no-such-op"}, timeout=30, python=str(wrapper), jail=jail)
        first = (seen / "first").read_text().splitlines()
        assert first[0] == str(CAROL.uid), first
        assert any(
            line.endswith("/" + jail.dir.name) for line in first[1:] if "memory" in line or line.startswith("0::")
        ), first
        assert not jail.dir.exists()  # removed after
    finally:
        agent.close()
        remove_cgroups(cgroup_root)


@needs_root
def test_the_launcher_runs_nothing_when_it_cannot_join_a_jail_it_must(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    argv = [sys.executable, str(ENTER), "--strict", "--user", "231301:231301", str(tmp_path / "no" / "cgroup.procs")]
    done = subprocess.run([*argv, "--", "/bin/touch", str(marker)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 125 and "could not join" in done.stderr and not marker.exists()
    loose = subprocess.run([sys.executable, str(ENTER), str(tmp_path / "no" / "cgroup.procs"), "--", "/bin/true"])
    assert loose.returncode == 0  # without --strict (a fault's launcher): reported, and run
    for bad in (["--user", "x:1"], ["--user"], ["--user", "5"]):
        done = subprocess.run([sys.executable, str(ENTER), *bad, "--", "/bin/true"], capture_output=True, text=True)
        assert done.returncode == 2, bad


@needs_root
def test_what_the_helper_left_in_its_jail_is_killed_and_the_jail_removed(tmp_path: Path) -> None:
    """Red team s28: only the helper's own pid was killed; a child it left behind kept running
    in the jail, and the jail (a cgroup with a process in it) could not be removed."""
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    agent, jail = _jail(tmp_path, cgroup_root)
    marker = f"sleep 3000.{uuid.uuid4().int % 10**9}"  # a child of its own, and a name to find it by
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nsetsid {marker} </dev/null >/dev/null 2>&1 &\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    for p in (tmp_path, *tmp_path.parents):
        os.chmod(p, os.stat(p).st_mode | 0o001)
    try:
        with pytest.raises(TenantCacheError):
            run_helper(CAROL, {"op": "no-such-op"}, timeout=30, python=str(wrapper), jail=jail)
        assert not jail.dir.exists()
        left = subprocess.run(["pgrep", "-fx", marker], capture_output=True, text=True).stdout.split()
        assert left == [], left
    finally:
        subprocess.run(["pkill", "-fx", marker], check=False)
        agent.close()
        remove_cgroups(cgroup_root)
