"""What a job started with a tenant's JobUser really runs as (node agent + shim, real processes):
the uid/gid with no supplementary groups, no_new_privs, its rlimits, umask 077, its own HOME,
and the folders it may write. A program the uid cannot reach is refused with the reason before
anything runs. And the pure parts: privilege detection and the permission walk."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sluice.agent.isolation import (
    REQUIRED_CAPS,
    Isolation,
    IsolationUnavailable,
    detect_isolation,
    interpreter_problem,
    unreachable,
)
from sluice.agent.launchenv import LaunchError
from sluice.agent.node_agent import NodeAgent
from sluice.model import Allocation, JobUser, LaunchRequest
from sluice.server import job_python_problem
from sluice.settings import Settings
from sluice.spec import JobSpec
from tests.integration.conftest import kill_runs, remove_cgroups, wait_exited
from tests.isolating import needs_root

USER = JobUser(231_001, 231_001)

PROBE = """
import getpass, json, os, resource
status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
old = os.umask(0); os.umask(old)
print('PROBE ' + json.dumps({
    'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid(), 'groups': os.getgroups(),
    'no_new_privs': status['NoNewPrivs'].strip(), 'nofile': resource.getrlimit(resource.RLIMIT_NOFILE),
    'nproc': resource.getrlimit(resource.RLIMIT_NPROC), 'core': resource.getrlimit(resource.RLIMIT_CORE),
    'umask': old, 'home': os.environ['HOME'], 'user': os.environ.get('USER'), 'cwd': os.getcwd(),
    'getuser': getpass.getuser(), 'tmp': __import__('tempfile').gettempdir(),
}), flush=True)
"""


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgent]:
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root, job_max_open_files=1000, job_max_processes=500)
    settings.home.mkdir(mode=0o711)
    a = NodeAgent("n0", settings.runs_dir, settings=settings)
    yield a
    a.close()
    kill_runs(settings.runs_dir)
    remove_cgroups(cgroup_root)


@needs_root
def test_the_job_runs_as_its_tenant_uid_confined(agent: NodeAgent, tmp_path: Path) -> None:
    req = LaunchRequest(
        "probe", 1, "t", JobSpec(command=["python", "-c", PROBE]), Allocation.single("n0"), "", run_as=USER
    )
    agent.launch(req)
    assert wait_exited(agent, "probe").exit_code == 0
    log = Path(agent.log_path("probe")).read_text()
    got = json.loads(next(ln for ln in log.splitlines() if ln.startswith("PROBE ")).removeprefix("PROBE "))
    work = agent.job_dir("probe") / "work"
    assert (got["uid"], got["euid"], got["gid"], got["groups"]) == (USER.uid, USER.uid, USER.gid, [])
    assert got["no_new_privs"] == "1" and got["umask"] == 0o077
    assert got["nofile"] == [1000, 1000] and got["nproc"] == [500, 500] and got["core"] == [0, 0]
    assert got["home"] == str(work) == got["cwd"]
    # Not the plane's user, but a name: the uid has no passwd entry, and getpass.getuser()
    # (PyTorch's DDP calls it) raised without one.
    assert got["user"] == got["getuser"] == f"sluice-{USER.uid}"
    # The folders it may write are its own; the plane's around them are passable only.
    assert (work.stat().st_uid, stat.S_IMODE(work.stat().st_mode)) == (USER.uid, 0o700)
    # Its temporary files go in its run folder (counted against its disk bound, removed with
    # it), not the host's /tmp, in a folder of its own no other uid may enter.
    tmp = agent.job_dir("probe") / "tmp"
    assert got["tmp"] == str(tmp) and (tmp.stat().st_uid, stat.S_IMODE(tmp.stat().st_mode)) == (USER.uid, 0o700)
    adir = agent.attempt_dir("probe", 1)
    assert (adir / "progress.jsonl").stat().st_uid == USER.uid
    assert stat.S_IMODE(adir.stat().st_mode) == 0o711 and adir.stat().st_uid == os.geteuid()
    agent.poll()  # the exit is marked reported at the poll after the one that told it
    for plane_file in ("state.json", "exit_code", "child.json", "exit_reported"):
        assert stat.S_IMODE((adir / plane_file).stat().st_mode) == 0o600, plane_file


@needs_root
def test_a_program_the_job_uid_cannot_reach_is_refused_with_the_reason(agent: NodeAgent, tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    script = private / "train.py"
    script.write_text("print('never')\n")
    script.chmod(0o755)
    req = LaunchRequest("hidden", 1, "t", JobSpec(command=[str(script)]), Allocation.single("n0"), "", run_as=USER)
    with pytest.raises(LaunchError, match=f"runs as uid {USER.uid} and cannot use"):
        agent.launch(req)
    exited = wait_exited(agent, "hidden")
    assert exited.exit_code == 127 and str(private) in exited.reason
    assert exited.retryable is False  # the controller fails the job at once: a retry meets the same wall


@needs_root
def test_the_plane_names_a_job_interpreter_tenant_uids_cannot_run_when_it_starts(tmp_path: Path) -> None:
    """A venv on a pyenv under /root (0700) is what `scripts/setup.sh` makes on some machines:
    `sluice up` says so before the first job fails on it."""
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    python = private / "python3"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    problem = interpreter_problem(str(python), USER)
    assert problem is not None and str(private) in problem and "SLUICE_JOB_PYTHON" in problem
    private.chmod(0o755)
    assert interpreter_problem(str(python), USER) is None
    on = Isolation(True, "on")
    settings = Settings(home=tmp_path / "h", job_python=str(python), job_uid_min=USER.uid, job_uid_max=USER.uid)
    assert job_python_problem(settings, on) is None
    private.chmod(0o700)
    assert job_python_problem(settings, on) is not None
    assert job_python_problem(settings, Isolation(False, "off")) is None  # jobs run as the plane's own user


def test_privilege_detection_names_what_is_missing() -> None:
    everything = "CapEff:\t000001ffffffffff\n"
    assert detect_isolation("auto", status=everything).enabled
    without_setuid = f"CapEff:\t{(0x1FFFFFFFFFF & ~(1 << REQUIRED_CAPS['CAP_SETUID'])):016x}\n"
    off = detect_isolation("auto", status=without_setuid)
    assert not off.enabled and "CAP_SETUID" in off.reason and "isolation is off" in off.reason
    with pytest.raises(IsolationUnavailable, match="CAP_SETUID"):
        detect_isolation("on", status=without_setuid)
    assert not detect_isolation("off", status=everything).enabled


def test_the_permission_walk_reads_every_folder_on_the_way(tmp_path: Path) -> None:
    outer = tmp_path / "outer"
    inner = outer / "inner"
    inner.mkdir(parents=True)
    f = inner / "f"
    f.write_text("x")
    tmp_path.chmod(0o711)
    outer.chmod(0o700)
    f.chmod(0o644)
    problem = unreachable(f, USER, os.R_OK)
    assert problem is not None and str(outer) in problem
    outer.chmod(0o711)
    assert unreachable(f, USER, os.R_OK) is None
    assert unreachable(f, USER, os.X_OK) is not None  # 0644: not executable
    if os.geteuid() == 0:
        os.chown(f, USER.uid, USER.gid)
        f.chmod(0o700)
        assert unreachable(f, USER, os.R_OK | os.X_OK) is None  # the owner bits are its own


def _plane_folders(agent: NodeAgent, job: str) -> list[str]:
    """Folders of the plane's a checkpoint location could name if submit's check were bypassed."""
    jdir = agent.job_dir(job)
    return [
        str(jdir),  # location "." / "./"
        str(jdir) + "/",
        str(jdir / "attempt-1"),  # the attempt being launched
        str(jdir / "attempt-70" / "x"),
        str(jdir / "attempt-x"),  # adopted like an attempt after a restart
        str(jdir / "job.log"),
        str(jdir / "work" / "ckpt"),  # inside the job's own folder: root would mkdir/chmod there
        str(jdir / "ckpt" / ".." / "attempt-1"),
        str(agent.runs_dir),
        str(agent.runs_dir.parent),  # $SLUICE_HOME
    ]


@needs_root
def test_the_agent_never_hands_a_plane_folder_to_a_tenant_uid(agent: NodeAgent) -> None:
    """Defence in depth behind control/confine.py: a launch whose checkpoint folder is the run
    folder, an attempt folder, job.log, the work folder, the runs folder or the home is refused
    for good (not retried), and every one of those folders stays the plane's, 0711."""
    for k, folder in enumerate(_plane_folders(agent, "evil")):
        spec = JobSpec(command=["python", "-c", "print('never')"])
        req = LaunchRequest("evil", k + 1, "t", spec, Allocation.single("n0"), folder, run_as=USER)
        with pytest.raises(LaunchError, match=r"checkpoint\.location: .*the plane never hands its own folders"):
            agent.launch(req)
        exited = wait_exited(agent, "evil")
        assert exited.retryable is False and "checkpoint.location" in exited.reason
    jdir = agent.job_dir("evil")
    for plane_dir in (agent.runs_dir, jdir, jdir / "attempt-1"):
        st = plane_dir.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o711), plane_dir
    assert not (jdir / "attempt-x").exists() and not (jdir / "attempt-70").exists()
    assert (jdir / "job.log").is_file() and (jdir / "job.log").stat().st_uid == os.geteuid()
    # a folder below the run folder that is none of the plane's is the job's, as before
    spec = JobSpec(command=["python", "-c", "pass"])
    ckpt = agent.job_dir("fine") / "ckpt"
    agent.launch(LaunchRequest("fine", 1, "t", spec, Allocation.single("n0"), str(ckpt), run_as=USER))
    assert wait_exited(agent, "fine").exit_code == 0
    assert (ckpt.stat().st_uid, stat.S_IMODE(ckpt.stat().st_mode)) == (USER.uid, 0o700)
    assert agent.job_dir("fine").stat().st_uid == os.geteuid()


@needs_root
def test_a_job_owned_folder_named_like_an_attempt_is_never_adopted(agent: NodeAgent, tmp_path: Path) -> None:
    """A job (location `attempt-x` stored before it was refused) writes a state.json naming a
    process of someone else's: a new agent must not attach to it, signal it or report it."""
    victim = subprocess.Popen(["sleep", "60"])
    try:
        jdir = agent.job_dir("forged")
        jdir.mkdir(mode=0o711)
        for name, attempt in (("attempt-x", 1), ("attempt-2", 2)):
            adir = jdir / name
            adir.mkdir(mode=0o700)
            state = {
                "job_id": "forged",
                "attempt": attempt,
                "node": "n0",
                "shim_pid": victim.pid,
                "shim_create_time": psutil.Process(victim.pid).create_time(),
                "cgroup": "forged",
            }
            (adir / "state.json").write_text(json.dumps(state))
            os.chown(adir, USER.uid, USER.gid)  # the job's folder, as the old bug made it
            os.chown(adir / "state.json", USER.uid, USER.gid)
        again = NodeAgent("n0", agent.runs_dir, settings=agent.settings)
        try:
            assert again.alive() == {} and not any(job == "forged" for job, _ in again._watched)
        finally:
            again.close()
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
