"""The disk watch's measure and its decisions (agent/disk_watch.py): blocks on disk, each inode
once, no link followed, a bound on the walk; a job past its resources.disk_mb, and under the
node's reserve the one holding the most."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.agent.disk_watch import (
    MIB,
    RESERVE_MIN_ENTRIES,
    RESERVE_MIN_HOLD,
    DiskWatch,
    FolderSize,
    Watched,
    folder_size,
    verdicts,
)
from sluice.spec import SpecError, parse_job_spec


def _write(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(os.urandom(n))
        f.flush()
        os.fsync(f.fileno())


def test_a_folder_is_measured_by_what_it_holds_on_disk_each_file_once_and_never_through_a_link(
    tmp_path: Path,
) -> None:
    job = tmp_path / "runs" / "j-1"
    _write(job / "work" / "data.bin", 3 * MIB)
    with open(job / "work" / "sparse.bin", "wb") as f:
        f.truncate(1 << 30)  # 1 GiB of size, nothing on disk
    os.link(job / "work" / "data.bin", job / "work" / "again.bin")  # a hard link: the same blocks
    outside = tmp_path / "outside"
    _write(outside / "big.bin", 8 * MIB)
    os.symlink(outside, job / "work" / "link-to-dir")
    os.symlink(outside / "big.bin", job / "work" / "link-to-file")
    size = folder_size([job])
    assert size.complete
    assert 3 * MIB <= size.bytes < 4 * MIB, size  # not the 1 GiB sparse size, not the link's 8 MiB, data once
    assert folder_size([job, job / "work"]).bytes == size.bytes  # a folder named twice counts once
    assert folder_size([tmp_path / "none"]) == FolderSize(0, 0)


def test_what_only_the_folders_after_the_first_hold_is_told_apart(tmp_path: Path) -> None:
    """A gang replica measures its own folder and its gang's (its one log, its checkpoints):
    what the gang's holds is `shared`, so that only one replica's report counts it."""
    own, gang = tmp_path / "j-1--r1of2", tmp_path / "j-1"
    _write(own / "work" / "mine.bin", 2 * MIB)
    _write(gang / "checkpoints" / "ckpt-1.pt", 5 * MIB)
    os.link(own / "work" / "mine.bin", gang / "mine-again.bin")  # counted where first reached: own
    size = folder_size([own, gang])
    assert 7 * MIB <= size.bytes < 8 * MIB and 5 * MIB <= size.shared < 6 * MIB, size
    assert folder_size([own]).shared == 0 and folder_size([gang]).shared == 0
    assert folder_size([tmp_path / "none", gang]).shared == folder_size([gang]).bytes  # an own folder not made yet


def test_the_walk_stops_at_its_bound_of_entries(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"f{i}").touch()
    assert not folder_size([tmp_path], most_entries=10).complete
    assert folder_size([tmp_path], most_entries=100).complete


A, B, C = ("j-a", 1), ("j-b", 1), ("j-c", 1)


def test_a_job_past_its_own_bound_is_stopped_saying_so() -> None:
    sizes = {A: FolderSize(40 * MIB, 3), B: FolderSize(40 * MIB, 3), C: FolderSize(1, 1, complete=False)}
    found = verdicts(sizes, {A: 16, B: None, C: None}, free_bytes=10 << 30, reserve_bytes=1 << 30)
    assert set(found) == {A, C}
    assert found[A] == "disk: its run folder holds 40 MiB, past its resources.disk_mb of 16 MiB"
    assert "more than 1,000,000 files and folders" in found[C]


def test_under_the_reserve_the_job_holding_the_most_is_stopped_one_a_check() -> None:
    sizes = {A: FolderSize(300 * MIB, 3), B: FolderSize(2 << 30, 3), C: FolderSize(RESERVE_MIN_HOLD - 1, 1)}
    found = verdicts(sizes, {}, free_bytes=100 * MIB, reserve_bytes=1 << 30)
    assert list(found) == [B] and "held the most of the jobs there (2.00 GiB)" in found[B]
    assert "100 MiB free, under its reserve of 1.00 GiB" in found[B]
    assert verdicts(sizes, {}, free_bytes=2 << 30, reserve_bytes=1 << 30) == {}  # enough free
    assert verdicts(sizes, {}, free_bytes=0, reserve_bytes=0) == {}  # no reserve
    # a disk filled by something else: no job holds enough to be the cause
    assert verdicts({C: sizes[C]}, {}, free_bytes=0, reserve_bytes=1 << 30) == {}
    # one already stopped for its own bound is not counted twice
    both = verdicts(sizes, {B: 1024}, free_bytes=0, reserve_bytes=1 << 30)
    assert set(both) == {A, B} and "resources.disk_mb" in both[B] and "held the most" in both[A]


def test_the_watch_keeps_what_it_found_until_taken_once(tmp_path: Path) -> None:
    _write(tmp_path / "j-a" / "big.bin", 2 * MIB)
    watch = DiskWatch(tmp_path, lambda: [Watched(A, (tmp_path / "j-a",), 1)], every_s=3600, reserve_percent=0)
    assert A in watch.check() and A in watch.sizes
    assert list(watch.take()) == [A] and watch.take() == {}


def test_disk_mb_is_a_positive_bounded_number_of_mib() -> None:
    base = {"command": ["python", "t.py"]}
    assert parse_job_spec({**base, "resources": {"disk_mb": 512}}).resources.disk_mb == 512
    for bad in (0, -1, 2**40, "lots", 1.5):
        with pytest.raises(SpecError, match=r"resources\.disk_mb"):
            parse_job_spec({**base, "resources": {"disk_mb": bad}})


def _nest(top: Path, levels: int, name: str = "d" * 200) -> int:
    """Folders nested `levels` deep under `top` by relative names (their path passes PATH_MAX
    soon, as a job's chdir-and-mkdir loop makes them); an open descriptor of the deepest."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir(name, dir_fd=fd)
        deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    return fd


def test_a_file_below_a_path_longer_than_path_max_is_counted(tmp_path: Path) -> None:
    job = tmp_path / "j-1"
    job.mkdir()
    fd = _nest(job, 30)  # about 6,000 bytes of path: no lstat or scandir by name reaches it
    try:
        f = os.open("big.bin", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(f, os.urandom(4 * MIB))
        os.fsync(f)
        os.close(f)
    finally:
        os.close(fd)
    size = folder_size([job])
    assert size.complete and size.bytes >= 4 * MIB, size


def test_folders_nested_past_the_walks_depth_stop_it_and_the_job(tmp_path: Path) -> None:
    os.close(_nest(tmp_path, 12, "d"))
    assert folder_size([tmp_path], most_depth=20).complete
    deep = folder_size([tmp_path], most_depth=10)
    assert not deep.complete and deep.too_deep
    found = verdicts({A: deep}, {A: None}, free_bytes=10 << 30, reserve_bytes=0)
    assert "nested more than 256 deep" in found[A]


HOLDER = (
    "import mmap, os, sys, tempfile\n"
    "where, how = sys.argv[1], sys.argv[2]\n"
    "if how == 'tempfile':\n"
    "    f = tempfile.TemporaryFile(dir=where)\n"  # O_TMPFILE, or unlinked at once: no name
    "    f.write(os.urandom(3 << 20)); f.flush(); os.fsync(f.fileno())\n"
    "else:\n"  # mapped, then unlinked and its descriptor closed: only the mapping holds it
    "    path = os.path.join(where, 'gone.bin')\n"
    "    with open(path, 'wb') as g:\n"
    "        g.write(os.urandom(5 << 20)); g.flush(); os.fsync(g.fileno())\n"
    "    g = open(path, 'rb'); m = mmap.mmap(g.fileno(), 0, prot=mmap.PROT_READ); g.close(); os.unlink(path)\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.mark.parametrize(("how", "held"), [("tempfile", 3 * MIB), ("mapped", 5 * MIB)])
def test_a_file_the_job_holds_open_with_no_name_is_counted(tmp_path: Path, how: str, held: int) -> None:
    """tempfile.TemporaryFile in its TMPDIR (the run folder's tmp/) names nothing in the folder,
    nor does a file unlinked while open or mapped: its blocks stay taken all the same."""
    job = tmp_path / "j-1"
    (job / "tmp").mkdir(parents=True)
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(job / "tmp"), how], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        assert folder_size([job]).bytes < MIB  # the walk alone sees nothing
        assert folder_size([job], pids=[p.pid]).bytes >= held
        assert folder_size([job], pids=[os.getpid()]).bytes < MIB  # not another process's
        watch = DiskWatch(tmp_path, lambda: [Watched(A, (job,), 2, pid=p.pid)], every_s=3600, reserve_percent=0)
        assert "past its resources.disk_mb of 2 MiB" in watch.check()[A]
    finally:
        p.kill()
        p.wait()


def test_under_the_reserve_of_inodes_the_job_holding_the_most_files_is_stopped() -> None:
    """Empty files take inodes, not bytes: a disk out of inodes takes no new file (the plane's
    database's journal included) with its bytes free."""
    sizes = {A: FolderSize(MIB, 50_000), B: FolderSize(MIB, 200_000), C: FolderSize(MIB, RESERVE_MIN_ENTRIES - 1)}
    found = verdicts(sizes, {}, free_bytes=10 << 30, reserve_bytes=1 << 30, free_inodes=100, reserve_inodes=5_000)
    assert list(found) == [B] and "100 inodes free, under its reserve of 5,000" in found[B]
    assert "held the most files and folders of the jobs there (200,000)" in found[B]
    assert verdicts(sizes, {}, 10 << 30, 1 << 30, free_inodes=6_000, reserve_inodes=5_000) == {}  # enough
    assert verdicts({C: sizes[C]}, {}, 10 << 30, 1 << 30, free_inodes=0, reserve_inodes=5_000) == {}  # not its doing


def test_under_the_reserve_a_job_that_wrote_nothing_since_the_last_check_is_not_stopped() -> None:
    """The job filling the disk is stopped, but its folder stays: the disk stays short, and a
    neighbour holding 64 MiB of checkpoints and writing nothing is not the next one stopped."""
    still, growing = FolderSize(300 * MIB, 3), FolderSize(100 * MIB, 4)
    before = {A: still, B: FolderSize(90 * MIB, 3)}
    found = verdicts({A: still, B: growing}, {}, free_bytes=0, reserve_bytes=1 << 30, before=before)
    assert list(found) == [B]
    assert verdicts({A: still}, {}, free_bytes=0, reserve_bytes=1 << 30, before=before) == {}
    assert list(verdicts({C: still}, {}, free_bytes=0, reserve_bytes=1 << 30, before=before)) == [
        C
    ]  # new: measured first now


def test_hard_links_of_one_file_count_towards_the_walks_bound(tmp_path: Path) -> None:
    """Counted once for their blocks, but each a name the walk reads: links to one inode (65,000
    each on ext4, as many inodes as one likes) made the walk as long as a job wished, past its
    bound, and every job's check waited on it."""
    _write(tmp_path / "one.bin", 4096)
    for i in range(30):
        os.link(tmp_path / "one.bin", tmp_path / f"link{i}")
    bounded = folder_size([tmp_path], most_entries=10)
    assert not bounded.complete and not bounded.too_deep
    size = folder_size([tmp_path])
    assert size.complete and size.bytes < 64 * 1024  # the blocks still once


def test_the_check_interval_has_a_floor() -> None:
    """A near-zero interval made the watch walk without a pause, taking the agent's CPU."""
    from sluice.settings import Settings

    with pytest.raises(ValueError, match="disk_check_s"):
        Settings(disk_check_s=1e-9)
    assert Settings(disk_check_s=0.1).disk_check_s == 0.1


def test_nodes_sharing_a_disk_share_a_watch_one_stop_a_check_each_taking_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Virtual nodes are agents on one disk: each with a watch of its own, a disk short of its
    reserve had each stop its own biggest job in the same check (red team s28). One watch
    judges both; each agent takes only what was found for its own jobs."""
    import sluice.agent.disk_watch as dw

    monkeypatch.setattr(dw, "RESERVE_MIN_HOLD", 1)
    _write(tmp_path / "j-a" / "a.bin", 2 * MIB)
    _write(tmp_path / "j-b" / "b.bin", 3 * MIB)
    node0 = lambda: [Watched(A, (tmp_path / "j-a",), None)]  # noqa: E731
    node1 = lambda: [Watched(B, (tmp_path / "j-b",), None)]  # noqa: E731
    watch = DiskWatch(tmp_path, None, every_s=3600, reserve_percent=100)  # always short
    watch.add(node0)
    watch.add(node1)
    assert list(watch.check()) == [B]  # one for the disk: the biggest of both nodes
    assert watch.take([A]) == {} and list(watch.take([B])) == [B]
    watch.remove(node1)
    _write(tmp_path / "j-a" / "more.bin", 2 * MIB)
    assert list(watch.check()) == [A]  # node1's jobs no longer judged


def test_the_local_engines_virtual_nodes_share_one_watch(tmp_path: Path) -> None:
    from sluice.engine.local import LocalEngine
    from sluice.settings import Settings

    engine = LocalEngine(Settings(home=tmp_path / "home", virtual_nodes=2, cgroup_root=f"sluice-test-dw{os.getpid()}"))
    try:
        watches = {id(agent.disk) for agent in engine.agents.values()}
        assert watches == {id(engine.disk_watch)} and len(engine.agents) == 2
    finally:
        engine.close()
        from tests.integration.conftest import remove_cgroups

        remove_cgroups(f"sluice-test-dw{os.getpid()}")


def test_an_agent_closed_leaves_the_shared_watch(tmp_path: Path) -> None:
    """An agent adds and removes its bound method, a new object at each access: removed by
    identity, a closed agent was asked for its jobs for as long as the watch ran."""

    class Agent:
        def __init__(self) -> None:
            self.asked = 0

        def watched(self) -> list[Watched]:
            self.asked += 1
            return []

    agent = Agent()
    watch = DiskWatch(tmp_path, None, every_s=3600, reserve_percent=0)
    watch.add(agent.watched)
    watch.check()
    watch.remove(agent.watched)
    watch.check()
    assert agent.asked == 1
