"""resources.memory_mb on the real kernel: the local engine's memory cgroup, OOM kills reported
as OOMKilled with the peak, retried per max_restarts, and a neighbour left alone; an OOM kill
nobody watched reported after adoption; a node without a memory controller refusing the launch.

Skipped where this machine has no writable cgroup memory controller (the plane then refuses
memory_mb at submit: tests/unit/test_api.py covers that).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.agent.cgroup import CgroupKind, CgroupLayout, detect_memory
from sluice.agent.launchenv import LaunchError
from sluice.agent.node_agent import NodeAgent
from sluice.control.plane import ControlPlane
from sluice.model import Allocation, JobExited, JobRecord, LaunchRequest, Phase
from sluice.settings import Settings
from sluice.spec import JobSpec, parse_job_spec
from tests.integration.conftest import JOBS, SYSFS, kill_runs, remove_cgroups, wait_for

pytestmark = pytest.mark.integration


def _memory_controller() -> bool:
    name = f"sluice-probe-{uuid.uuid4().hex[:8]}"
    try:
        return detect_memory(SYSFS, name)[0] is not None
    finally:
        remove_cgroups(name)


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        home=tmp_path / "home",
        cgroup_root=cgroup_root,
        reconcile_interval_s=0.1,
        restart_backoff_s=0.3,
        stop_grace_s=5,
        usage_sample_s=0.25,
        policy="kube",
    )
    p = ControlPlane.from_settings(settings)
    p.bootstrap_tenants()
    p.start()
    try:
        yield p
    finally:
        p.stop()
        kill_runs(settings.runs_dir)
        remove_cgroups(cgroup_root)


def _ended(plane: ControlPlane, job_id: str) -> JobRecord | None:
    caller = plane.store.get_tenant("default")
    assert caller is not None
    job = plane.get_job(caller, job_id)
    return job if job.phase.terminal else None


@pytest.mark.skipif(not _memory_controller(), reason="no writable cgroup memory controller on this machine")
def test_a_memory_hog_is_oom_killed_at_its_limit_and_its_neighbour_runs_on(plane: ControlPlane, tmp_path: Path) -> None:
    caller = plane.store.get_tenant("default")
    assert caller is not None and plane.engine.capabilities.memory_limits
    neighbour_pids, hog_pids = tmp_path / "neighbour.pids", tmp_path / "hog.pids"
    neighbour = plane.submit(
        caller,
        parse_job_spec(
            {
                "name": "neighbour",
                "command": ["python", str(JOBS / "steady.py")],
                "workdir": str(JOBS),
                "env": {"PID_FILE": str(neighbour_pids), "STEPS": "50", "STEP_S": "0.1"},
                "resources": {"cpu": {"min": 0.5, "max": 1}, "memory_mb": 512},
                "max_restarts": 0,
            }
        ),
    )
    assert wait_for(lambda: neighbour_pids.exists(), timeout=60), "the neighbour never started"
    hog = plane.submit(
        caller,
        parse_job_spec(
            {
                "name": "hog",
                "command": ["python", str(JOBS / "memory_hog.py")],
                "workdir": str(JOBS),
                "env": {"PID_FILE": str(hog_pids), "HOG_MB": "1024"},
                "resources": {"cpu": {"min": 0.5, "max": 1}, "memory_mb": 64},
                "max_restarts": 1,
            }
        ),
    )
    assert wait_for(lambda: _ended(plane, hog.id) is not None, timeout=90), "the hog was never stopped"
    failed = _ended(plane, hog.id)
    assert failed is not None and failed.phase == Phase.FAILED, failed
    assert failed.reason.startswith("OOMKilled: exceeded memory limit 64 MiB (peak "), failed.reason
    assert failed.exit_code == -9 and failed.restarts == 1 and failed.attempt == 2
    peak = re.search(r"\(peak (\d+) MiB\)", failed.reason)
    assert peak is not None and 40 <= int(peak.group(1)) <= 64, failed.reason
    assert len(hog_pids.read_text().splitlines()) == 2  # max_restarts 1: two attempts, no more
    why = [e.message for e in plane.why(caller, hog.id)]
    assert any("OOMKilled: exceeded memory limit 64 MiB" in m and "retry 1/1" in m for m in why), why
    log = Path(plane.engine.log_path(hog.id) or "").read_text()
    assert "[sluice] OOMKilled: exceeded memory limit 64 MiB" in log and "done without being killed" not in log

    running = plane.get_job(caller, neighbour.id)
    assert running.phase == Phase.RUNNING, running  # the hog's OOM kills stayed inside its cgroup
    assert wait_for(lambda: _ended(plane, neighbour.id) is not None, timeout=60)
    done = plane.get_job(caller, neighbour.id)
    assert done.phase == Phase.SUCCEEDED and done.attempt == 1, done
    assert len(neighbour_pids.read_text().splitlines()) == 1


def test_a_job_without_memory_mb_gets_no_memory_cgroup(plane: ControlPlane, tmp_path: Path) -> None:
    """memory_mb unset: no limit is invented (the job is only in the CPU side's cgroups)."""
    caller = plane.store.get_tenant("default")
    assert caller is not None
    pids = tmp_path / "free.pids"
    job = plane.submit(
        caller,
        parse_job_spec(
            {
                "name": "free",
                "command": ["python", str(JOBS / "memory_hog.py")],
                "workdir": str(JOBS),
                "env": {"PID_FILE": str(pids), "HOG_MB": "96"},
                "max_restarts": 0,
            }
        ),
    )
    assert wait_for(lambda: _ended(plane, job.id) is not None, timeout=60)
    done = _ended(plane, job.id)
    assert done is not None and done.phase == Phase.SUCCEEDED, done


def _hog_request(tmp_path: Path, job_id: str, limit_mb: int) -> LaunchRequest:
    spec = JobSpec.model_validate(
        {
            "command": ["python", str(JOBS / "memory_hog.py")],
            "workdir": str(JOBS),
            "env": {"PID_FILE": str(tmp_path / f"{job_id}.pids"), "HOG_MB": "1024"},
            "resources": {"memory_mb": limit_mb},
        }
    )
    return LaunchRequest(job_id, 1, "t1", spec, Allocation.single("n0", 1.0, None), str(tmp_path / job_id))


@pytest.mark.skipif(not _memory_controller(), reason="no writable cgroup memory controller on this machine")
def test_an_oom_kill_nobody_watched_is_reported_by_the_agent_that_adopts_it(
    sluice_settings: Settings, tmp_path: Path
) -> None:
    first = NodeAgent("n0", sluice_settings.runs_dir, settings=sluice_settings)
    first.launch(_hog_request(tmp_path, "hog", 48))
    cgroup = first.layout.memory_parent / "hog.1" if first.layout.memory_parent else None
    assert cgroup is not None
    limit = cgroup / ("memory.max" if first.layout.memory_kind is CgroupKind.V2 else "memory.limit_in_bytes")
    assert int(limit.read_text()) == 48 * 1024 * 1024
    first.close()  # forgets the attempt: the job dies at its limit while no agent watches
    assert wait_for(lambda: (sluice_settings.runs_dir / "hog" / "attempt-1" / "exit_code").exists(), timeout=60)
    second = NodeAgent("n0", sluice_settings.runs_dir, settings=sluice_settings)
    exits: list[JobExited] = []
    try:  # the shim may still be on its way out after writing exit_code: poll until reported
        assert wait_for(lambda: bool(exits.extend(e for e in second.poll() if isinstance(e, JobExited)) or exits))
    finally:
        second.close()
    assert len(exits) == 1 and exits[0].exit_code == -9, exits
    oom = exits[0].oom
    assert oom is not None and oom.limit_mb == 48 and oom.peak_bytes is not None
    assert 32 * 1024 * 1024 <= oom.peak_bytes <= 48 * 1024 * 1024
    assert not cgroup.exists()  # cleaned up once reported (the kill counted there: the job was inside)


def test_an_agent_without_a_memory_controller_refuses_to_launch_a_memory_limit(
    sluice_settings: Settings, tmp_path: Path
) -> None:
    """Never run unlimited: a node that cannot enforce memory_mb fails the launch, naming it."""
    agent = NodeAgent(
        "n0", sluice_settings.runs_dir, settings=sluice_settings, layout=CgroupLayout(CgroupKind.AFFINITY)
    )
    try:
        assert agent.info().labels["memory-limits"] == "none"
        with pytest.raises(LaunchError, match=r"resources\.memory_mb: node n0 cannot enforce a memory limit"):
            agent.launch(_hog_request(tmp_path, "hog", 64))
        exits = [e for e in agent.poll() if isinstance(e, JobExited)]
        assert len(exits) == 1 and exits[0].exit_code == 127 and "resources.memory_mb" in exits[0].reason
        assert not (tmp_path / "hog.pids").exists()  # nothing ran
    finally:
        agent.close()
