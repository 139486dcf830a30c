"""The Unix-socket fence (agent/landlock.py): attacked with real jobs under two tenant uids.

An abstract Unix socket has no file, so no permission stops another uid connecting to it; the
network fence does not see Unix sockets. With the fence, a job reaches only the abstract
sockets its own processes made, and cannot read (ptrace) processes outside it, its own
tenant's included. With `unix_fence: off` the same attacks get through (so each assertion
below could fail)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.agent import landlock
from sluice.agent.node_agent import NodeAgent
from sluice.model import Allocation, JobUser, LaunchRequest
from sluice.settings import Settings
from sluice.spec import JobSpec
from tests.integration.conftest import kill_runs, remove_cgroups, wait_exited
from tests.isolating import needs_root

pytestmark = [
    needs_root,
    pytest.mark.skipif(bool(landlock.missing()), reason=landlock.missing() or "has Landlock scopes"),
]

ALICE = JobUser(231_301, 231_301)
BOB = JobUser(231_302, 231_302)

SERVER = """
import os, socket, sys, time
name = sys.argv[1].encode()
s = socket.socket(socket.AF_UNIX)
s.bind(b'\\0' + name)
s.listen(16)
if os.fork() == 0:  # a child of the job: inside its domain, it gets through
    c = socket.socket(socket.AF_UNIX)
    c.connect(b'\\0' + name)
    print('CHILD', c.recv(2).decode(), flush=True)
    os._exit(0)
end = time.time() + 60
while time.time() < end:
    c, _ = s.accept()
    c.sendall(b'hi')
    c.close()
"""

CLIENT = """
import socket, sys
try:
    c = socket.socket(socket.AF_UNIX)
    c.settimeout(5)
    c.connect(b'\\0' + sys.argv[1].encode())
    print('CONNECT', c.recv(2).decode() or 'closed', flush=True)
except OSError as e:
    print('CONNECT', type(e).__name__, flush=True)
"""

SNOOP = """
import sys
try:
    data = open(f'/proc/{sys.argv[1]}/environ', 'rb').read()
    print('SNOOP', 'read' if b'SECRET=' in data else 'empty', flush=True)
except OSError as e:
    print('SNOOP', type(e).__name__, flush=True)
"""


@pytest.fixture
def settings(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Settings]:
    root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    s = Settings(home=tmp_path / "home", cgroup_root=root, unix_fence=getattr(request, "param", "auto"))
    s.home.mkdir(mode=0o711)
    yield s
    kill_runs(s.runs_dir)
    remove_cgroups(root)


def _run(agent: NodeAgent, job_id: str, user: JobUser, script: str, arg: str, tag: str) -> str:
    agent.launch(LaunchRequest(job_id, 1, "t", JobSpec(command=["python", "-c", script, arg]),
                               Allocation.single("n0"), "", run_as=user))  # fmt: skip
    assert wait_exited(agent, job_id).exit_code == 0, Path(agent.log_path(job_id)).read_text()
    log = Path(agent.log_path(job_id)).read_text()
    return next(ln for ln in log.splitlines() if ln.startswith(f"{tag} ")).removeprefix(f"{tag} ")


def _attacks(settings: Settings) -> dict[str, str]:
    """Alice's job listens on an abstract socket; Bob's job, and another job of Alice's, try
    to connect; Bob's job tries to read a Bob-uid process that is not a job."""
    agent = NodeAgent("n0", settings.runs_dir, settings=settings)
    name = f"sluice-unix-fence-{uuid.uuid4().hex[:8]}"
    python = os.environ.get("SLUICE_JOB_PYTHON") or sys.executable
    outside = subprocess.Popen(
        [python, "-c", "import time; time.sleep(60)"], user=BOB.uid, group=BOB.gid, extra_groups=[],
        env={"SECRET": "bob-token"}, cwd="/",
    )  # fmt: skip
    try:
        agent.launch(LaunchRequest("server", 1, "t", JobSpec(command=["python", "-c", SERVER, name]),
                                   Allocation.single("n0"), "", run_as=ALICE))  # fmt: skip
        log = Path(agent.log_path("server"))
        deadline = time.monotonic() + 30
        while "CHILD" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
            time.sleep(0.1)
        found = {"child": next(ln for ln in log.read_text().splitlines() if ln.startswith("CHILD ")).split()[1]}
        with socket.socket(socket.AF_UNIX) as c:  # the plane is in no domain: it gets through
            c.settimeout(5)
            c.connect(b"\0" + name.encode())
            found["plane"] = c.recv(2).decode()
        found["bob"] = _run(agent, "bob", BOB, CLIENT, name, "CONNECT")
        found["alice"] = _run(agent, "alice", ALICE, CLIENT, name, "CONNECT")
        found["snoop"] = _run(agent, "snoop", BOB, SNOOP, str(outside.pid), "SNOOP")
        agent.stop("server", 1, checkpoint=False)
        wait_exited(agent, "server")
        return found
    finally:
        outside.kill()
        outside.wait()
        agent.close()


def test_a_job_reaches_only_the_abstract_unix_sockets_its_own_processes_made(settings: Settings) -> None:
    found = _attacks(settings)
    assert found["child"] == "hi" and found["plane"] == "hi"  # the socket is there, and its job's children reach it
    assert found["bob"] == "PermissionError"  # another tenant's job: refused
    assert found["alice"] == "PermissionError"  # another job, even of the same tenant
    assert found["snoop"] == "PermissionError"  # a process outside the job, even of its own uid


@pytest.mark.parametrize("settings", ["off"], indirect=True)
def test_without_the_fence_the_same_attacks_get_through(settings: Settings) -> None:
    found = _attacks(settings)
    assert found == {"child": "hi", "plane": "hi", "bob": "hi", "alice": "hi", "snoop": "read"}


def test_the_agent_says_why_a_node_s_jobs_are_not_fenced(tmp_path: Path) -> None:
    s = Settings(home=tmp_path / "home", cgroup_root=f"sluice-test-{uuid.uuid4().hex[:8]}", unix_fence="off")
    s.home.mkdir(mode=0o711)
    agent = NodeAgent("n0", s.runs_dir, settings=s)
    try:
        assert "unix_fence=off" in agent.unix_fence_missing
    finally:
        agent.close()
        remove_cgroups(s.cgroup_root)
