"""A job's disk, on the real local engine: past its resources.disk_mb it is stopped and fails,
not retried, saying so in its reason and its log, while a neighbour runs on; on a disk short of
the node's reserve (a small tmpfs holding the plane's home), the job holding the most is
stopped before the disk is full, and the plane's database still takes writes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.agent.disk_watch import DiskWatch, Watched
from sluice.agent.node_agent import NodeAgent
from sluice.control.plane import ControlPlane
from sluice.model import Allocation, JobExited, JobRecord, LaunchRequest, Phase
from sluice.settings import Settings
from sluice.spec import parse_job_spec
from tests.integration.conftest import kill_runs, remove_cgroups, wait_for
from tests.isolating import needs_root

pytestmark = pytest.mark.integration

WRITER = (
    "import os, sys, time\n"
    "mb, every = int(sys.argv[1]), float(sys.argv[2])\n"
    "with open('out.bin', 'wb') as f:\n"
    "    for _ in range(mb):\n"
    "        f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno()); time.sleep(every)\n"
    "time.sleep(float(sys.argv[3]))\n"
)


def _plane(home: Path, **kw: object) -> ControlPlane:
    settings = Settings(
        home=home,
        cgroup_root=f"sluice-test-{uuid.uuid4().hex[:8]}",
        reconcile_interval_s=0.1,
        restart_backoff_s=0.2,
        stop_grace_s=5,
        policy="kube",
        **{"disk_check_s": 0.3, **kw},  # type: ignore[arg-type]
    )
    p = ControlPlane.from_settings(settings)
    p.bootstrap_tenants()
    p.start()
    return p


def _close(p: ControlPlane) -> None:
    p.stop()
    kill_runs(p.settings.runs_dir)
    assert p.settings.cgroup_root is not None
    remove_cgroups(p.settings.cgroup_root)


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    p = _plane(tmp_path / "home")
    try:
        yield p
    finally:
        _close(p)


def _writer(name: str, mb: int, every: float = 0.0, then: float = 30.0, **resources: object) -> object:
    return parse_job_spec(
        {
            "name": name,
            "command": ["python", "-c", WRITER, str(mb), str(every), str(then)],
            "resources": {"cpu": {"min": 0.25}, **resources},
            "max_restarts": 3,
        }
    )


def _ended(p: ControlPlane, job: JobRecord) -> JobRecord:
    got = p.controller.book.get(job.id)
    assert got is not None
    return got


def test_a_job_past_its_disk_mb_fails_unretried_and_its_neighbour_runs_on(plane: ControlPlane) -> None:
    caller = plane.store.get_tenant("default")
    assert caller is not None
    hog = plane.submit(caller, _writer("hog", 40, every=0.05, disk_mb=16))  # type: ignore[arg-type]
    calm = plane.submit(caller, _writer("calm", 2, then=3.0, disk_mb=64))  # type: ignore[arg-type]
    assert wait_for(lambda: _ended(plane, hog).phase.terminal, 60), _ended(plane, hog).reason
    done = _ended(plane, hog)
    assert done.phase == Phase.FAILED and done.restarts == 0, done.reason
    assert "disk: its run folder holds" in done.reason and "past its resources.disk_mb of 16 MiB" in done.reason
    assert "not retried" in done.reason
    log = Path(plane.engine.log_path(hog.id) or "").read_text()
    assert "[sluice] disk: its run folder holds" in log
    written = os.path.getsize(plane.settings.runs_dir / hog.id / "work" / "out.bin")
    assert 16 << 20 < written < 40 << 20  # stopped on its way, not at the end
    assert wait_for(lambda: _ended(plane, calm).phase.terminal, 60)
    assert _ended(plane, calm).phase == Phase.SUCCEEDED, _ended(plane, calm).reason
    # what each held at its last check is on its record (`job get`'s disk row): the neighbour's
    # 2 MiB and its log; the hog past its 16 MiB
    calm_mb, hog_mb = _ended(plane, calm).disk_mb, done.disk_mb
    assert calm_mb is not None and 2.0 <= calm_mb < 3.0, calm_mb
    assert hog_mb is not None and 16.0 < hog_mb <= 40.0, hog_mb


@needs_root
def test_a_job_filling_the_disk_is_stopped_at_the_reserve_and_the_plane_keeps_writing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=0755", "tmpfs", str(home)])
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        p = _plane(home, disk_reserve_percent=40)  # keep about 102 MiB of 256 free
        try:
            caller = p.store.get_tenant("default")
            assert caller is not None
            # No disk_mb: only the reserve bounds it. Unbounded, 300 MiB would fill the disk.
            filler = p.submit(caller, _writer("filler", 300, every=0.01))  # type: ignore[arg-type]
            small = p.submit(caller, _writer("small", 1, then=2.0))  # type: ignore[arg-type]
            assert wait_for(lambda: _ended(p, filler).phase.terminal, 90), _ended(p, filler).reason
            done = _ended(p, filler)
            assert done.phase == Phase.FAILED and done.restarts == 0, done.reason
            assert "under its reserve of" in done.reason and "held the most of the jobs there" in done.reason
            assert os.statvfs(home).f_bavail * os.statvfs(home).f_frsize > 40 << 20  # never full
            assert wait_for(lambda: _ended(p, small).phase.terminal, 60)
            assert _ended(p, small).phase == Phase.SUCCEEDED, _ended(p, small).reason
            after = p.submit(caller, _writer("after", 1, then=0.0))  # type: ignore[arg-type]
            assert p.store.get_job(after.id) is not None  # the database took it
        finally:
            _close(p)
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


def test_what_a_job_writes_to_a_temporary_file_with_no_name_counts_against_its_disk_mb(plane: ControlPlane) -> None:
    """tempfile.TemporaryFile (in its TMPDIR, the run folder's tmp/) has no name in any folder
    the walk reads; its blocks are the job's all the same, and count."""
    caller = plane.store.get_tenant("default")
    assert caller is not None
    spool = (
        "import os, tempfile, time\n"
        "f = tempfile.TemporaryFile()\n"
        "for _ in range(40):\n"
        "    f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno()); time.sleep(0.05)\n"
        "time.sleep(30)\n"
    )
    spec = parse_job_spec(
        {
            "name": "spool",
            "command": ["python", "-c", spool],
            "resources": {"cpu": {"min": 0.25}, "disk_mb": 16},
            "max_restarts": 3,
        }
    )
    job = plane.submit(caller, spec)
    assert wait_for(lambda: _ended(plane, job).phase.terminal, 60), _ended(plane, job).reason
    done = _ended(plane, job)
    assert done.phase == Phase.FAILED and done.restarts == 0, done.reason
    assert "past its resources.disk_mb of 16 MiB" in done.reason


def test_a_job_asked_to_stop_is_still_measured_through_its_grace(plane: ControlPlane) -> None:
    """Cancelled (SIGTERM, then stop_grace_s), a job that ignores SIGTERM and writes on is
    still bounded: its grace is no window for writing unmeasured."""
    caller = plane.store.get_tenant("default")
    assert caller is not None
    deaf = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open('started', 'w').close()\n"
        "while not os.path.exists('go'): time.sleep(0.02)\n"
        "with open('out.bin', 'wb') as f:\n"
        "    for _ in range(40):\n"
        "        f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno()); time.sleep(0.08)\n"
        "time.sleep(30)\n"
    )
    spec = parse_job_spec(
        {"name": "deaf", "command": ["python", "-c", deaf], "resources": {"cpu": {"min": 0.25}, "disk_mb": 16}}
    )
    job = plane.submit(caller, spec)
    work = plane.settings.runs_dir / job.id / "work"
    assert wait_for(lambda: (work / "started").exists(), 30), _ended(plane, job).reason
    plane.cancel(caller, job.id)
    (work / "go").touch()  # writes only once asked to stop (stop_grace_s is 5 here, 40 MiB take 3.2 s)
    assert wait_for(lambda: _ended(plane, job).phase.terminal, 60), _ended(plane, job).reason
    assert _ended(plane, job).phase == Phase.CANCELLED, _ended(plane, job).reason
    assert os.path.getsize(work / "out.bin") < 40 << 20  # stopped on its way, not at its grace's end
    assert "[sluice] disk: its run folder holds" in Path(plane.engine.log_path(job.id) or "").read_text()


def test_a_disk_stop_keeps_its_reason_through_a_later_stop_and_an_agent_restart(tmp_path: Path) -> None:
    """The plane's own stop (a cancel, a gang's) landing after the watch killed a job, before
    the agent saw it die, rewrote the stop file without the disk reason: the next agent then
    reported a plain SIGKILL, retryable."""
    settings = Settings(home=tmp_path / "home", cgroup_root=f"sluice-test-{uuid.uuid4().hex[:8]}", disk_check_s=3600)
    spec = parse_job_spec({"command": ["python", "-c", WRITER, "4", "0", "60"], "resources": {"disk_mb": 1}})
    req = LaunchRequest("fat", 1, "t1", spec, Allocation.single("n0", 1.0, None), str(tmp_path / "ckpt"))
    try:
        first = NodeAgent("n0", settings.runs_dir, settings=settings)
        first.launch(req)
        out = settings.runs_dir / "fat" / "work" / "out.bin"
        assert wait_for(lambda: out.exists() and out.stat().st_size >= 4 << 20, 30)
        assert "disk_mb of 1 MiB" in first.disk.check()[("fat", 1)]
        with first._lock:
            first._stop_for_disk(first.clock())  # what poll does first
        first.stop("fat", 1, checkpoint=False)  # the plane's, before any poll saw the end
        first.close()
        second = NodeAgent("n0", settings.runs_dir, settings=settings)
        try:
            exits: list[JobExited] = []
            assert wait_for(lambda: bool(exits.extend(e for e in second.poll() if isinstance(e, JobExited)) or exits))
            assert "past its resources.disk_mb of 1 MiB" in exits[0].reason and not exits[0].retryable, exits[0]
        finally:
            second.close()
    finally:
        kill_runs(settings.runs_dir)
        assert settings.cgroup_root is not None
        remove_cgroups(settings.cgroup_root)


@needs_root
def test_a_job_taking_the_disks_inodes_is_stopped_at_the_reserve(tmp_path: Path) -> None:
    """A disk of few inodes (a tmpfs of 40,000) that a job fills with empty files: no byte
    reserve sees it, the reserve of inodes does (10 %: 4,000)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=40000", "tmpfs", str(disk)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        job = disk / "j-1"
        job.mkdir()
        with contextlib.suppress(OSError):  # until the disk takes no more
            for i in range(40_000):
                (job / f"f{i}").touch()
        assert os.statvfs(disk).f_favail < 4_000 and os.statvfs(disk).f_bavail > 0
        watch = DiskWatch(disk, lambda: [Watched(("j-1", 1), (job,), None)], every_s=3600, reserve_percent=10)
        found = watch.check()
        assert "inodes free, under its reserve of 4,000" in found[("j-1", 1)], found
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@needs_root
def test_under_the_reserve_a_neighbour_writing_nothing_outlives_the_job_that_filled_the_disk(tmp_path: Path) -> None:
    """The filler is stopped, its 90-odd MiB stay in its run folder, the disk stays short of its
    reserve: a neighbour holding 70 MiB (past the 64 MiB floor) that writes nothing more was the
    next job stopped, Failed and not retried, for what another tenant wrote."""
    home = tmp_path / "home"
    home.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=0755", "tmpfs", str(home)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        p = _plane(home, disk_reserve_percent=40)
        try:
            caller = p.store.get_tenant("default")
            assert caller is not None
            keeper = p.submit(caller, _writer("keeper", 70, then=8.0))  # type: ignore[arg-type]
            out = p.settings.runs_dir / keeper.id / "work" / "out.bin"
            assert wait_for(lambda: out.exists() and out.stat().st_size >= 70 << 20, 60)
            filler = p.submit(caller, _writer("filler", 300, every=0.01))  # type: ignore[arg-type]
            assert wait_for(lambda: _ended(p, filler).phase.terminal, 90), _ended(p, filler).reason
            assert "under its reserve of" in _ended(p, filler).reason
            assert wait_for(lambda: _ended(p, keeper).phase.terminal, 60)
            assert _ended(p, keeper).phase == Phase.SUCCEEDED, _ended(p, keeper).reason
        finally:
            _close(p)
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


def test_a_gangs_disk_counts_the_folder_its_replicas_share_once(tmp_path: Path) -> None:
    """On the local engine every replica of a gang measures its own run folder and the gang's
    (its one log, its checkpoints): summed over the replicas, the gang's folder counted once a
    replica, so 8 MiB of checkpoint read as 16 on 2 replicas."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores for 2 virtual nodes")
    p = _plane(tmp_path / "home", virtual_nodes=2)
    try:
        caller = p.store.get_tenant("default")
        assert caller is not None
        blob = (
            "import os, time\n"
            "if os.environ['RANK'] == '0':\n"
            "    os.makedirs(os.environ['SLUICE_CHECKPOINT_DIR'], exist_ok=True)\n"
            "    with open(os.path.join(os.environ['SLUICE_CHECKPOINT_DIR'], 'blob'), 'wb') as f:\n"
            "        f.write(os.urandom(8 << 20)); f.flush(); os.fsync(f.fileno())\n"
            "time.sleep(60)\n"
        )
        spec = parse_job_spec(
            {
                "name": "gang",
                "command": ["python", "-c", blob],
                "resources": {"cpu": {"min": 0.25}, "replicas": {"min": 2, "max": 2}},
            }
        )
        job = p.submit(caller, spec)  # type: ignore[arg-type]
        shared = p.settings.runs_dir / job.id / "checkpoints" / "blob"
        assert wait_for(lambda: shared.exists() and shared.stat().st_blocks * 512 >= 8 << 20, 60), _ended(p, job)

        def measured() -> float:
            return _ended(p, job).disk_mb or 0.0

        assert wait_for(lambda: measured() >= 8.0, 30), _ended(p, job)
        time.sleep(1.5)  # a few more checks of both replicas
        on_disk = sum(
            f.stat().st_blocks * 512
            for top in p.settings.runs_dir.iterdir()
            if top.name.startswith(job.id)
            for f in [top, *top.rglob("*")]
            if not f.is_symlink()
        ) / (1 << 20)
        assert 8.0 <= measured() <= on_disk + 1.0, (measured(), on_disk)
    finally:
        _close(p)


def test_a_job_that_ends_before_any_disk_check_is_measured_as_it_ends(tmp_path: Path) -> None:
    """What a job leaves in its run folder counts against its tenant's max_disk_mb though it ended
    before the disk watch's first check (red team s29): it read as never measured, so a tenant's
    short jobs could fill the disk under any cap."""
    p = _plane(tmp_path / "home", disk_check_s=600)
    try:
        caller = p.store.get_tenant("default")
        assert caller is not None
        quick = p.submit(caller, _writer("quick", 8, then=0.0))  # type: ignore[arg-type]
        assert wait_for(lambda: _ended(p, quick).phase.terminal, 60), _ended(p, quick).reason
        done = _ended(p, quick)
        assert done.phase == Phase.SUCCEEDED, done.reason
        assert done.disk_mb is not None and 8.0 <= done.disk_mb < 9.0, done.disk_mb
    finally:
        _close(p)


def test_a_slow_last_walk_holds_up_no_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk as a job ends runs in a thread of its own: a folder of a million files takes
    seconds to walk, and the local engine polls its nodes in the plane's round, which waited
    for it (red team s29). The job's exit, with what the walk found, is told when it is done."""
    import threading
    import time

    import sluice.agent.node_agent as node_agent

    real, walking = node_agent.folder_size, threading.Event()

    def slow(*args: object, **kw: object) -> object:
        walking.set()
        time.sleep(3.0)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(node_agent, "folder_size", slow)
    p = _plane(tmp_path / "home", disk_check_s=600)
    try:
        caller = p.store.get_tenant("default")
        assert caller is not None
        quick = p.submit(caller, _writer("quick", 2, then=0.0))  # type: ignore[arg-type]
        assert walking.wait(30)
        started = time.monotonic()
        waits = []
        while time.monotonic() - started < 2.0:
            t = time.monotonic()
            with p.controller.lock:
                pass
            waits.append(time.monotonic() - t)
            time.sleep(0.05)
        assert max(waits) < 1.0, max(waits)
        assert not _ended(p, quick).phase.terminal  # told once the walk is done
        assert wait_for(lambda: _ended(p, quick).phase.terminal, 30)
        done = _ended(p, quick)
        assert done.phase == Phase.SUCCEEDED and done.disk_mb is not None and done.disk_mb >= 2.0, done
    finally:
        _close(p)
