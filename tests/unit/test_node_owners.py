"""The records of who owns each node's cgroups, and the sweep that removes a dead agent's
empty groups (agent/node_owners.py). A fake cgroup mount of plain directories: rmdir behaves
the same on an empty one, and refuses one holding a file as a cgroup refuses one holding a
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sluice.agent.node_owners import NodeOwners


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _tree(sysfs: Path, node: str) -> list[Path]:
    dirs = [sysfs / "cpu" / "sluice" / node, sysfs / "memory" / "sluice" / node, sysfs / "unified" / "sluice" / node]
    for d in dirs:
        d.mkdir(parents=True)
    (dirs[0] / "faults").mkdir()
    (dirs[2] / "job-1--a1").mkdir()  # a finished job's empty group under the node's
    return dirs


def _record(owners: NodeOwners, node: str, dirs: list[Path], pid: int, start: int | None) -> Path:
    with owners.claiming("sluice", node) as record:
        record(dirs)
    path = next(p for p in owners.directory.glob("*.json") if json.loads(p.read_text())["node"] == node)
    data = json.loads(path.read_text())
    data.update(pid=pid, start=start)
    path.write_text(json.dumps(data))
    return path


def test_a_dead_agents_empty_groups_are_removed_by_the_next_agent_and_a_live_ones_stay(tmp_path: Path) -> None:
    sysfs, reg = tmp_path / "cgroup", tmp_path / "owners"
    owners = NodeOwners(reg, sysfs)
    dead = _tree(sysfs, "ray-dead")
    live = _tree(sysfs, "ray-live")
    dead_rec = _record(owners, "ray-dead", dead, _dead_pid(), 1)
    live_rec = _record(owners, "ray-live", live, os.getpid(), owners.start)
    # A pid reused by another process: same pid, another start time -> gone.
    reused = _tree(sysfs, "ray-reused")
    reused_rec = _record(owners, "ray-reused", reused, os.getpid(), (owners.start or 0) + 1)

    with NodeOwners(reg, sysfs).claiming("sluice", "ray-new") as record:
        record([])

    assert not any(d.exists() for d in dead + reused), "a dead owner's empty groups (and empty children) stay"
    assert not dead_rec.exists() and not reused_rec.exists()
    assert all(d.exists() for d in live) and (live[0] / "faults").exists(), "a live agent's groups were removed"
    assert live_rec.exists()
    assert (sysfs / "cpu" / "sluice").is_dir(), "the root itself is not the node's to remove"


def test_a_group_still_holding_a_process_stays_with_its_record_for_a_later_sweep(tmp_path: Path) -> None:
    sysfs, reg = tmp_path / "cgroup", tmp_path / "owners"
    owners = NodeOwners(reg, sysfs)
    dirs = _tree(sysfs, "n0")
    busy = dirs[2] / "job-2--a1"
    busy.mkdir()
    (busy / "cgroup.procs").write_text("1234\n")  # a job left running for the next agent to adopt
    rec = _record(owners, "n0", dirs, _dead_pid(), 1)

    removed = owners.sweep()

    assert busy.exists() and dirs[2].exists() and rec.exists()
    assert not dirs[0].exists() and not (dirs[2] / "job-1--a1").exists()
    assert dirs[0] in removed
    (busy / "cgroup.procs").unlink()  # the job ended
    owners.sweep()
    assert not dirs[2].exists() and not rec.exists()


def test_a_record_naming_anything_outside_the_cgroup_mount_is_never_acted_on(tmp_path: Path) -> None:
    sysfs, reg = tmp_path / "cgroup", tmp_path / "owners"
    owners = NodeOwners(reg, sysfs)
    outside = tmp_path / "home" / "precious"
    outside.mkdir(parents=True)
    mount_root = sysfs / "cpu"
    (mount_root / "sluice").mkdir(parents=True)  # so the sneaky path below resolves
    sneaky = sysfs / "cpu" / "sluice" / ".." / ".." / ".." / "home" / "precious"
    _record(owners, "x", [outside, mount_root, sneaky], _dead_pid(), 1)

    assert owners.sweep() == []
    assert outside.is_dir() and mount_root.is_dir()


def test_records_are_private_and_the_owner_drops_its_own_on_close(tmp_path: Path) -> None:
    sysfs, reg = tmp_path / "cgroup", tmp_path / "owners"
    owners = NodeOwners(reg, sysfs)
    dirs = _tree(sysfs, "h0")
    with owners.claiming("sluice", "h0") as record:
        record(dirs)
    (rec,) = reg.glob("*.json")
    assert reg.stat().st_mode & 0o777 == 0o700 and rec.stat().st_mode & 0o777 == 0o600
    owners.release("sluice", "h0")
    assert rec.exists(), "released while its groups are still there"
    for d in dirs:
        for child in d.iterdir():
            child.rmdir()
        d.rmdir()
    NodeOwners(reg, sysfs).release("sluice", "h0")  # same process: still the owner
    assert not rec.exists()


def test_a_new_agent_of_the_same_node_takes_the_record_over_and_its_groups_are_not_swept(tmp_path: Path) -> None:
    sysfs, reg = tmp_path / "cgroup", tmp_path / "owners"
    owners = NodeOwners(reg, sysfs)
    dirs = _tree(sysfs, "n1")
    rec = _record(owners, "n1", dirs, _dead_pid(), 1)
    with owners.claiming("sluice", "n1") as record:  # the restarted agent of n1 (adopts its jobs)
        record(dirs)
    assert all(d.exists() for d in dirs)
    assert json.loads(rec.read_text())["pid"] == os.getpid()
    owners.sweep()
    assert all(d.exists() for d in dirs)


def test_without_a_writable_records_directory_nothing_is_recorded_or_swept(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    owners = NodeOwners(blocker / "owners", tmp_path)
    with owners.claiming("sluice", "n0") as record:
        record([tmp_path / "x"])
    assert owners.sweep() == []


def test_a_node_a_live_agent_of_another_process_owns_is_refused(tmp_path: Path) -> None:
    """Two planes on one host with one node name (both `vm`, both under `sluice`) shared each
    other's groups, and one closing removed what the other was using: the second is refused,
    naming the setting that separates them. A dead owner's node is taken over as before."""
    import pytest

    from sluice.agent.node_owners import NodeInUse

    sysfs, reg = tmp_path / "cgroup", tmp_path / "owners"
    owners = NodeOwners(reg, sysfs)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from sluice.agent.shim import process_start_ticks

        _record(owners, "vm", _tree(sysfs, "vm"), other.pid, process_start_ticks(other.pid))
        with pytest.raises(NodeInUse, match="SLUICE_CGROUP_ROOT"), NodeOwners(reg, sysfs).claiming("sluice", "vm"):
            pass
    finally:
        other.kill()
        other.wait()
    with NodeOwners(reg, sysfs).claiming("sluice", "vm") as record:  # its owner is gone: taken over
        record([])
