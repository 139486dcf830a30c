"""NodeAgent with real job processes under real kernel CPU limits.

Jobs are tests/integration/jobs/sdk_loop.py (the SDK's report/checkpoint/should_stop in a
loop) — small and fast, so these tests exercise the mechanism, not PyTorch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sluice.agent.cgroup import CgroupKind
from sluice.agent.launchenv import LaunchError
from sluice.agent.node_agent import NodeAgent
from sluice.model import (
    Allocation,
    Event,
    JobCheckpointed,
    JobExited,
    JobProgress,
    JobStarted,
    JobUsage,
    LaunchRequest,
    runfolder,
)
from sluice.settings import Settings
from sluice.spec import JobSpec
from tests.fake_clock import FakeClock
from tests.integration.conftest import JOBS, wait_exited, wait_for

pytestmark = pytest.mark.integration

LOOP = str(JOBS / "sdk_loop.py")


class Collector:
    """Polls an agent and keeps every event, so a test can wait for one kind of event."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent
        self.events: list[Event] = []

    def poll(self) -> list[Event]:
        new = self.agent.poll()
        self.events.extend(new)
        return new

    def of(self, kind: type, job_id: str | None = None) -> list[Any]:
        return [
            e for e in self.events if isinstance(e, kind) and (job_id is None or getattr(e, "job_id", None) == job_id)
        ]

    def wait(self, kind: type, job_id: str, count: int = 1, timeout: float = 60.0) -> list[Any]:
        wait_for(lambda: bool(self.poll() is not None and len(self.of(kind, job_id)) >= count), timeout)
        found = self.of(kind, job_id)
        assert len(found) >= count, f"no {kind.__name__} for {job_id}; log:\n{_log(self.agent, job_id)}"
        return found


def _log(agent: NodeAgent, job_id: str) -> str:
    p = Path(agent.log_path(job_id))
    return p.read_text() if p.exists() else "(no log)"


def _req(
    tmp: Path, job_id: str, attempt: int, *args: str, limit: float | None = None, request: float = 1.0
) -> LaunchRequest:
    spec = JobSpec(command=["python", LOOP, *args], workdir=str(tmp))
    return LaunchRequest(
        job_id, attempt, "t1", spec, Allocation.single("n0", request, limit), str(tmp / job_id / "ckpt")
    )


@pytest.fixture
def agent(sluice_settings: Settings) -> Iterator[NodeAgent]:
    a = NodeAgent("n0", sluice_settings.runs_dir, settings=sluice_settings)
    yield a
    a.close()


def _quota(agent: NodeAgent, job_id: str, attempt: int) -> str:
    ctrl = agent.controller(job_id, attempt)
    assert ctrl is not None
    limits = ctrl.limits()
    return limits.get("cpu.cfs_quota_us") or limits.get("cpu.max") or limits["cpus"]


def test_launch_sets_cgroup_quota_and_resize_changes_it_in_place(agent: NodeAgent, tmp_path: Path) -> None:
    if agent.layout.kind is CgroupKind.AFFINITY:
        pytest.skip(f"no writable cgroup cpu controller here ({agent.layout.reason})")
    c = Collector(agent)
    agent.launch(_req(tmp_path, "quota", 1, "--busy", "--sleep", "0.01", limit=0.5, request=0.5))
    started = c.wait(JobStarted, "quota")[0]
    assert wait_for(lambda: agent.child_pid("quota", 1) is not None)
    child = agent.child_pid("quota", 1)
    ctrl = agent.controller("quota", 1)
    assert ctrl is not None and ctrl.cpu_dir is not None
    v1 = agent.layout.kind is CgroupKind.V1
    assert _quota(agent, "quota", 1) == ("50000" if v1 else "50000 100000")
    assert (ctrl.cpu_dir / ("cpu.shares" if v1 else "cpu.weight")).read_text().strip() == ("512" if v1 else "50")
    procs = {int(p) for p in (ctrl.cpu_dir / "cgroup.procs").read_text().split()}
    assert {started.pid, child} <= procs

    agent.resize("quota", 1, Allocation.single("n0", 0.25, 0.25))
    assert _quota(agent, "quota", 1) == ("25000" if v1 else "25000 100000")
    assert agent.child_pid("quota", 1) == child and psutil.pid_exists(child)
    assert child in {int(p) for p in (ctrl.cpu_dir / "cgroup.procs").read_text().split()}

    # The kernel enforces it: usage samples over the last second stay near the 0.25-core quota.
    before = len(c.of(JobUsage, "quota"))
    usage = c.wait(JobUsage, "quota", count=before + 6)[before + 2 :]
    mean = sum(u.cpu_cores for u in usage) / len(usage)
    assert mean < 0.4, f"busy job under a 0.25-core quota used {mean:.2f} cores"

    agent.resize("quota", 1, Allocation.single("n0", 1.0, None))
    assert _quota(agent, "quota", 1) == ("-1" if v1 else "max 100000")
    agent.stop("quota", 1, checkpoint=False)
    exited = c.wait(JobExited, "quota")[0]
    assert exited.exit_code == -9 and "SIGKILL" in exited.reason
    assert not ctrl.cpu_dir.exists(), "the attempt's cgroup is removed once it exits"


def test_usage_carries_the_attempts_cpu_seconds_to_its_end(agent: NodeAgent, tmp_path: Path) -> None:
    """Each JobUsage says how many CPU-seconds the attempt has used so far (its cgroup's
    counter), and a last one comes as it ends, before its exit: what a job used is counted
    to its end, however short it was, not to its last periodic sample."""
    if agent.layout.kind is CgroupKind.AFFINITY:
        pytest.skip(f"no cgroup CPU counter here ({agent.layout.reason})")
    c = Collector(agent)
    began = time.monotonic()
    # 1.5 s of wall time spinning (and the interpreter's start), all under a 0.5-core quota
    agent.launch(_req(tmp_path, "used", 1, "--busy", "--sleep", "0.05", "--steps", "30", limit=0.5, request=0.5))
    [exited] = c.wait(JobExited, "used")
    wall = time.monotonic() - began
    totals = [u.cpu_s for u in c.of(JobUsage, "used")]
    assert totals and all(t is not None for t in totals)
    assert totals == sorted(totals)  # a counter: never back
    last = totals[-1]
    # at least the spinning's share of the quota; at most the quota over the whole run
    assert 0.5 <= last <= 0.5 * wall + 0.3, f"used {last:.2f} CPU-seconds in {wall:.1f} s under 0.5 cores"
    assert c.of(JobUsage, "used")[-1].time >= exited.time  # read once it ended, not a sample before


def test_stop_checkpoints_and_relaunch_resumes(agent: NodeAgent, tmp_path: Path) -> None:
    c = Collector(agent)
    agent.launch(_req(tmp_path, "ck", 1, "--sleep", "0.02"))
    c.wait(JobProgress, "ck", count=5)
    agent.stop("ck", 1, checkpoint=True)
    exited = c.wait(JobExited, "ck")[0]
    assert exited.exit_code == 0, _log(agent, "ck")
    assert "SIGTERM" in exited.reason
    ckpt = c.of(JobCheckpointed, "ck")
    assert len(ckpt) == 1 and Path(ckpt[0].path).is_file()
    saved = ckpt[0].step
    assert agent.alive() == {}

    agent.launch(_req(tmp_path, "ck", 2, "--sleep", "0.02", "--steps", str(saved + 4)))
    done = c.wait(JobExited, "ck", count=2)[1]
    assert done.exit_code == 0 and done.attempt == 2
    second = [p.step for p in c.of(JobProgress, "ck") if p.attempt == 2]
    assert second == list(range(saved + 1, saved + 4))
    log = _log(agent, "ck")
    assert f"resumed at step {saved + 1}" in log
    assert "attempt 1 of ck" in log and "attempt 2 of ck" in log, "one log per job, a header per attempt"
    # Where each attempt starts in the log, recorded before it wrote (api/job_logs.by_attempt
    # puts a job that came back to a node in order by it): at its header.
    index = (Path(agent.log_path("ck")).parent / runfolder.JOB_LOG_INDEX).read_text()
    raw = Path(agent.log_path("ck")).read_bytes()
    assert index == f"1 0\n2 {raw.index(b'===== sluice: attempt 2 of ck')}\n"
    assert oct(os.stat(Path(agent.log_path("ck")).parent / runfolder.JOB_LOG_INDEX).st_mode & 0o777) == "0o600"
    last = [p for p in c.of(JobProgress, "ck") if p.attempt == 2][-1]
    assert last.metrics["total_steps"] == saved + 4 and last.loss == pytest.approx(1.0 / (saved + 4))


def test_nonzero_exit_and_bad_requests_are_reported(agent: NodeAgent, tmp_path: Path) -> None:
    c = Collector(agent)
    agent.launch(_req(tmp_path, "bad", 1, "--steps", "2", "--sleep", "0", "--exit-code", "3"))
    exited = c.wait(JobExited, "bad")[0]
    assert exited.exit_code == 3 and "code 3" in exited.reason

    spec = JobSpec(command=["no-such-program-xyz"], workdir=str(tmp_path))
    with pytest.raises(LaunchError, match="not found"):
        agent.launch(LaunchRequest("missing", 1, "t1", spec, Allocation.single("n0"), str(tmp_path / "c")))
    gone = c.wait(JobExited, "missing")[0]
    assert gone.exit_code == 127 and "no-such-program-xyz" in gone.reason
    assert (Path(agent.log_path("missing")).parent / runfolder.JOB_LOG_INDEX).read_text() == "1 0\n"

    spec = JobSpec(command=["python", LOOP], workdir=str(tmp_path / "nowhere"))
    with pytest.raises(LaunchError, match="workdir"):
        agent.launch(LaunchRequest("nowd", 1, "t1", spec, Allocation.single("n0"), str(tmp_path / "c")))
    assert "workdir" in c.wait(JobExited, "nowd")[0].reason


def test_new_agent_adopts_running_job_and_reports_unwatched_exit(sluice_settings: Settings, tmp_path: Path) -> None:
    first = NodeAgent("n0", sluice_settings.runs_dir, settings=sluice_settings)
    c1 = Collector(first)
    first.launch(_req(tmp_path, "long", 1, "--sleep", "0.05"))
    first.launch(_req(tmp_path, "short", 1, "--steps", "3", "--sleep", "0.01", "--exit-code", "5"))
    long_started = c1.wait(JobStarted, "long")[0]
    assert wait_for(lambda: first.child_pid("long", 1) is not None)
    long_child = first.child_pid("long", 1)
    assert long_child is not None
    first.close()  # the "control plane" goes away; nobody watches now
    short_shim = c1.wait(JobStarted, "short")[0].pid
    assert wait_for(lambda: _zombie(short_shim), timeout=60)

    second = NodeAgent("n0", sluice_settings.runs_dir, settings=sluice_settings)
    assert second.alive() == {"long": 1}
    c2 = Collector(second)
    c2.poll()
    exits = c2.of(JobExited)
    assert [(e.job_id, e.exit_code) for e in exits] == [("short", 5)]
    assert [p.step for p in c2.of(JobProgress, "short")] == [0, 1, 2], "progress written while unwatched"
    assert second.child_pid("long", 1) == long_child and psutil.pid_exists(long_child)
    c2.wait(JobProgress, "long", count=len(c2.of(JobProgress, "long")) + 1)

    third = NodeAgent("n0", sluice_settings.runs_dir, settings=sluice_settings)
    assert third.alive() == {"long": 1}
    assert not [e for e in third.poll() if isinstance(e, JobExited)], "an unwatched exit is reported once"
    third.close()

    second.stop("long", 1, checkpoint=True)
    exited = c2.wait(JobExited, "long")[0]
    assert exited.exit_code == 0 and _zombie(long_started.pid) and _zombie(long_child)
    second.close()


def test_an_exit_told_to_a_plane_that_died_before_its_next_poll_is_told_again(
    sluice_settings: Settings, tmp_path: Path
) -> None:
    """A plane is killed after a poll told it an exit and before it stored it: the next
    agent tells that exit again (the crash campaign's lost retry). Only the poll after the one
    that told it marks it reported. An agent that outlives its plane (Ray) tells it again after
    `retell`."""
    first = NodeAgent("n0", sluice_settings.runs_dir, settings=sluice_settings)
    first.launch(_req(tmp_path, "crash", 1, "--steps", "1", "--sleep", "0.01", "--exit-code", "3"))
    assert wait_exited(first, "crash").exit_code == 3
    first.close()  # killed before it polled again

    second = NodeAgent("n0", sluice_settings.runs_dir, settings=sluice_settings)
    told = [e for e in second.poll() if isinstance(e, JobExited)]
    assert [(e.job_id, e.attempt, e.exit_code) for e in told] == [("crash", 1, 3)]
    assert second.retell() == 1  # a new plane: it is told again, still unmarked
    again = [e for e in second.poll() if isinstance(e, JobExited)]
    assert [(e.job_id, e.exit_code) for e in again] == [("crash", 3)]
    assert not [e for e in second.poll() if isinstance(e, JobExited)]  # the poll after: stored, marked
    second.close()

    third = NodeAgent("n0", sluice_settings.runs_dir, settings=sluice_settings)
    assert not [e for e in third.poll() if isinstance(e, JobExited)], "told once it was stored"
    third.close()


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def test_job_gets_the_sdk_environment_and_not_the_control_planes(
    agent: NodeAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_SECRET_TOKEN", "do-not-leak")
    probe = (
        "import json, os, sys; "
        "json.dump({k: v for k, v in os.environ.items()}, open('env.json', 'w')); "
        "print(sys.executable)"
    )
    spec = JobSpec(
        command=["python", "-c", probe],
        workdir=str(tmp_path),
        env={"MY_VAR": "x"},
        resources={"cpu": {"min": 1, "max": 1.5}},  # type: ignore[arg-type]
    )
    c = Collector(agent)
    agent.launch(LaunchRequest("env", 1, "t1", spec, Allocation.single("n0"), str(tmp_path / "ck")))
    assert c.wait(JobExited, "env")[0].exit_code == 0
    import json

    env = json.loads((tmp_path / "env.json").read_text())
    assert "SLUICE_SECRET_TOKEN" not in env
    assert env["MY_VAR"] == "x" and env["SLUICE_JOB_ID"] == "env" and env["SLUICE_ATTEMPT"] == "1"
    assert env["SLUICE_RUN_DIR"].endswith("env/attempt-1") and env["SLUICE_CHECKPOINT_DIR"] == str(tmp_path / "ck")
    assert env["OMP_NUM_THREADS"] == "2" and env["CUDA_VISIBLE_DEVICES"] == ""
    python = agent.settings.job_python or sys.executable  # settings.job_python, when set (tests/conftest.py)
    assert python in _log(agent, "env"), "a leading 'python' runs the control plane's interpreter"


def test_a_job_ignoring_sigterm_is_killed_after_the_grace_period(sluice_settings: Settings, tmp_path: Path) -> None:
    """The grace is the agent's clock (a FakeClock here): a stubborn job lives through all of
    it and is SIGKILLed at the first poll after it — no waiting on wall time."""
    clock = FakeClock()
    settings = sluice_settings.model_copy(update={"stop_grace_s": 20.0})
    agent = NodeAgent("n0", sluice_settings.runs_dir, settings=settings, clock=clock)
    try:
        c = Collector(agent)
        stubborn = (
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: print('ignored SIGTERM', flush=True))\n"
            "print('ready', flush=True)\n"
            "while True: time.sleep(1)\n"
        )
        spec = JobSpec(command=["python", "-c", stubborn], workdir=str(tmp_path))
        agent.launch(LaunchRequest("stub", 1, "t1", spec, Allocation.single("n0"), str(tmp_path / "ck")))
        assert wait_for(lambda: "ready" in _log(agent, "stub"))
        agent.stop("stub", 1, checkpoint=True)
        assert wait_for(lambda: "ignored SIGTERM" in _log(agent, "stub")), "the SIGTERM never arrived"
        clock.advance(19.9)  # still inside the grace: the job keeps running
        c.poll()
        assert agent.alive() == {"stub": 1} and not c.of(JobExited, "stub")
        clock.advance(0.2)  # past it: the next poll kills (well before 20 s of wall time)
        exited = c.wait(JobExited, "stub", timeout=10)[0]
        assert exited.exit_code == -9 and "SIGKILL after grace" in exited.reason
    finally:
        agent.close()


def test_a_killed_agents_empty_node_groups_are_removed_by_the_next_agent(sluice_settings: Settings) -> None:
    """A detached Ray agent is killed with its cluster and closes nothing: its node's groups
    used to stay behind in every hierarchy. The next agent to start on the host removes them
    (agent/node_owners.py); a live agent's groups are left alone."""
    env = {
        **os.environ,
        "SLUICE_HOME": str(sluice_settings.home),
        "SLUICE_CGROUP_ROOT": str(sluice_settings.cgroup_root),
    }
    code = (
        "import sys, time\n"
        "from sluice.agent.node_agent import NodeAgent\n"
        "from sluice.settings import Settings\n"
        "s = Settings()\n"
        "a = NodeAgent('gc-dead', s.runs_dir, settings=s)\n"
        "print(a.groups.usage, flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        usage = Path(child.stdout.readline().strip())
        assert usage.is_dir(), f"the child agent made no node group ({usage})"
        live = NodeAgent("gc-live", sluice_settings.runs_dir, settings=sluice_settings)
        assert usage.is_dir(), "a live agent's groups were swept"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        assert usage.is_dir()  # nothing removes them on a kill...
        second = NodeAgent("gc-next", sluice_settings.runs_dir, settings=sluice_settings)
        dead_dirs = list(Path("/sys/fs/cgroup").glob(f"*/{sluice_settings.cgroup_root}/gc-dead"))
        assert dead_dirs == [], f"a killed agent's groups stayed: {dead_dirs}"
        assert live.groups.usage is not None and live.groups.usage.is_dir()
        second.close()
        live.close()
        assert list(Path("/sys/fs/cgroup").glob(f"*/{sluice_settings.cgroup_root}/gc-*")) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
