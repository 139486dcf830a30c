"""The network fence in the real kernel (agent/net_fence.py): one tenant's job cannot connect
to a socket another tenant's job listens on, on the same machine; the same tenant's jobs and
processes that are not jobs still can; the fence holds across an agent restart. Real jobs
under real uids, real nftables rules, real TCP over loopback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.agent.net_fence import TABLE_PREFIX, _nft, net_fence
from sluice.agent.node_agent import NodeAgent
from sluice.model import Allocation, JobUser, LaunchRequest
from sluice.settings import Settings
from sluice.spec import JobSpec
from tests.integration.conftest import kill_runs, remove_cgroups, wait_exited
from tests.isolating import needs_root

ALICE = JobUser(231_201, 231_201)
BOB = JobUser(231_202, 231_202)

SERVER = """
import os, socket, sys, time
s = socket.socket()
s.bind(('127.0.0.1', 0))
s.listen(16)
s.settimeout(0.5)
tmp = os.path.join(sys.argv[1], 'port.tmp')
with open(tmp, 'w') as f:
    f.write(str(s.getsockname()[1]))
os.chmod(tmp, 0o644)
os.rename(tmp, os.path.join(sys.argv[1], 'port'))
end = time.time() + 60
while time.time() < end:
    try:
        c, _ = s.accept()
        c.sendall(b'hi')
        c.close()
    except OSError:
        pass
"""

CLIENT = """
import socket, sys
port = int(open(sys.argv[1] + '/port').read())
try:
    c = socket.create_connection(('127.0.0.1', port), timeout=2)
    print('CONNECT', c.recv(2).decode() or 'closed', flush=True)
except OSError as e:
    print('CONNECT', type(e).__name__, flush=True)
"""


@pytest.fixture
def shared() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sluice-netfence-", dir="/tmp"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d)


def _agent(settings: Settings) -> NodeAgent:
    a = NodeAgent("n0", settings.runs_dir, settings=settings)
    if not a.net_fence.available:
        a.close()
        pytest.skip(f"no network fence here: {a.net_fence.missing}")
    return a


def _connect(agent: NodeAgent, job_id: str, user: JobUser, shared: Path) -> str:
    spec = JobSpec(command=["python", "-c", CLIENT, str(shared)])
    agent.launch(LaunchRequest(job_id, 1, "t", spec, Allocation.single("n0"), "", run_as=user))
    assert wait_exited(agent, job_id).exit_code == 0
    log = Path(agent.log_path(job_id)).read_text()
    return next(ln for ln in log.splitlines() if ln.startswith("CONNECT ")).removeprefix("CONNECT ")


def _connect_outside(user: JobUser, shared: Path) -> str:
    """CLIENT in a process of `user`'s uid that is in no job group (the tenant's dataset cache
    helper is one: its jobs may ptrace it, and a warm fetches a URL the tenant chose)."""
    python = os.environ.get("SLUICE_JOB_PYTHON") or sys.executable
    done = subprocess.run(
        [python, "-c", CLIENT, str(shared)], user=user.uid, group=user.gid, extra_groups=[], cwd="/",
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return next(ln for ln in done.stdout.splitlines() if ln.startswith("CONNECT ")).removeprefix("CONNECT ")


def _fence_rules(agent: NodeAgent) -> str:
    return _nft(agent.net_fence.nft, "list", "table", "inet", agent.net_fence.table).stdout


@needs_root
def test_a_tenant_s_job_cannot_connect_to_another_tenant_s_job(tmp_path: Path, shared: Path) -> None:
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root)
    settings.home.mkdir(mode=0o711)
    agent = _agent(settings)
    second = None
    try:
        server = JobSpec(command=["python", "-c", SERVER, str(shared)])
        agent.launch(LaunchRequest("server", 1, "t", server, Allocation.single("n0"), "", run_as=ALICE))
        deadline = time.monotonic() + 30
        while not (shared / "port").exists():
            assert time.monotonic() < deadline, Path(agent.log_path("server")).read_text()
            time.sleep(0.1)
        port = int((shared / "port").read_text())
        assert _connect(agent, "bob", BOB, shared) == "TimeoutError"  # the SYN is dropped
        assert _connect(agent, "alice", ALICE, shared) == "hi"  # her own jobs reach it
        # Bob's processes that are not jobs (his cache helper, which his jobs can ptrace) too.
        assert _connect_outside(BOB, shared) == "TimeoutError"
        assert _connect_outside(ALICE, shared) == "hi"
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:  # not a job: passes
            assert c.recv(2) == b"hi"
        # An agent restart (the plane's) keeps the rules of the job that runs on.
        agent.close()
        assert "fence:server.1" in _fence_rules(agent)
        second = agent = _agent(settings)
        assert _connect(agent, "bob2", BOB, shared) == "TimeoutError"
        rules = _fence_rules(agent)
        assert "fence:server.1" in rules and "fence:bob" not in rules, rules  # an ended attempt's went
    finally:
        agent.stop("server", 1, checkpoint=False)
        wait_exited(agent, "server")
        assert "fence:" not in _fence_rules(agent)
        table = agent.net_fence.table
        agent.close()
        listed = _nft(agent.net_fence.nft, "list", "tables", "inet").stdout
        assert table not in listed  # closed with no job running: the table goes
        kill_runs(settings.runs_dir)
        remove_cgroups(cgroup_root)
        del second


def test_fence_tables_are_named_for_their_node() -> None:
    from sluice.agent.net_fence import table_name, tenant_mark

    a, b = table_name(Path("/sys/fs/cgroup/unified/sluice/n0")), table_name(Path("/sys/fs/cgroup/unified/sluice/n1"))
    assert a != b and a.startswith(TABLE_PREFIX) and a == table_name(Path("/sys/fs/cgroup/unified/sluice/n0"))
    assert tenant_mark(200_001) == 0x80000000 | 200_001
    with pytest.raises(ValueError, match="uid 0"):
        tenant_mark(0)


@needs_root
def test_a_tenant_s_dataset_warm_is_fenced_too(tmp_path: Path, shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm runs a helper of the tenant's uid in no job group, fetching a URL the tenant
    chose (the node's own address, where an admin allowed its network): it is marked as the
    tenant's before it starts, though the tenant has no job on the node."""
    from sluice.agent import node_agent
    from sluice.data.warm import WarmReport

    carol = JobUser(231_203, 231_203)
    warmed: list[int] = []

    def fake_warm(settings: object, user: JobUser, node: str, *args: object, **kwargs: object) -> WarmReport:
        warmed.append(user.uid)  # the helper itself is tested elsewhere (tests of tenant_cache)
        return WarmReport(node, 0, 0, 0, 0.0, 1.0)

    monkeypatch.setattr(node_agent, "warm_as", fake_warm)
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root)
    settings.home.mkdir(mode=0o711)
    agent = _agent(settings)
    try:
        server = JobSpec(command=["python", "-c", SERVER, str(shared)])
        agent.launch(LaunchRequest("server", 1, "t", server, Allocation.single("n0"), "", run_as=ALICE))
        deadline = time.monotonic() + 30
        while not (shared / "port").exists():
            assert time.monotonic() < deadline, Path(agent.log_path("server")).read_text()
            time.sleep(0.1)
        assert agent.warm_dataset("ds", "file:///nowhere", run_as=carol).error is None
        assert warmed == [carol.uid]
        assert _connect_outside(carol, shared) == "TimeoutError"
    finally:
        agent.stop("server", 1, checkpoint=False)
        wait_exited(agent, "server")
        agent.close()
        kill_runs(settings.runs_dir)
        remove_cgroups(cgroup_root)


@needs_root
def test_a_job_that_cannot_enter_its_fenced_group_does_not_run(
    tmp_path: Path, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rules match the job's v2 group; outside it the job would be unmarked and its
    sockets open to every tenant. The shim joins it or runs nothing (as for the GPU fence)."""
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root)
    settings.home.mkdir(mode=0o711)
    agent = _agent(settings)
    add = agent.net_fence.add

    def add_then_lose_group(name: str, group: Path, uid: int) -> None:
        add(name, group, uid)
        group.rmdir()  # the shim's write to its cgroup.procs fails

    monkeypatch.setattr(agent.net_fence, "add", add_then_lose_group)
    try:
        spec = JobSpec(command=["python", "-c", "print('RAN', flush=True)"])
        agent.launch(LaunchRequest("j", 1, "t", spec, Allocation.single("n0"), "", run_as=BOB))
        ended = wait_exited(agent, "j")
        log = Path(agent.log_path("j")).read_text()
        assert ended.exit_code == 127 and "RAN" not in log, log
        assert "could not enter the job's GPU fence or network fence" in log, log
    finally:
        agent.close()
        kill_runs(settings.runs_dir)
        remove_cgroups(cgroup_root)


@needs_root
def test_the_table_goes_when_only_unfenced_jobs_outlive_the_agent(tmp_path: Path) -> None:
    """Without isolation no job is fenced: a job running on at close keeps nothing in the
    table, which would stay for good where this node does not come back (a test's root)."""
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root)
    settings.home.mkdir(mode=0o711)
    agent = _agent(settings)
    table = agent.net_fence.table
    try:
        spec = JobSpec(command=["python", "-c", "import time; time.sleep(60)"])
        agent.launch(LaunchRequest("j", 1, "t", spec, Allocation.single("n0"), ""))
        time.sleep(0.5)
        agent.close()
        assert table not in _nft(agent.net_fence.nft, "list", "tables", "inet").stdout
    finally:
        kill_runs(settings.runs_dir)
        remove_cgroups(cgroup_root)


@needs_root
def test_an_agent_closed_right_after_a_launch_leaves_the_job_fenced(tmp_path: Path, shared: Path) -> None:
    """An agent that closes (a plane restart) while a job's shim is still starting must not
    remove the job's v2 group under it: the job would run outside the group its rules match."""
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root)
    settings.home.mkdir(mode=0o711)
    agent = _agent(settings)
    try:
        server = JobSpec(command=["python", "-c", SERVER, str(shared)])
        agent.launch(LaunchRequest("server", 1, "t", server, Allocation.single("n0"), "", run_as=ALICE))
        deadline = time.monotonic() + 30
        while not (shared / "port").exists():
            assert time.monotonic() < deadline, Path(agent.log_path("server")).read_text()
            time.sleep(0.1)
        spec = JobSpec(command=["python", "-c", CLIENT, str(shared)])
        agent.launch(LaunchRequest("bob", 1, "t", spec, Allocation.single("n0"), "", run_as=BOB))
        agent.close()  # before bob's shim has entered its groups
        agent = _agent(settings)
        wait_exited(agent, "bob")
        log = Path(agent.log_path("bob")).read_text()
        assert "CONNECT hi" not in log, log
    finally:
        agent.stop("server", 1, checkpoint=False)
        wait_exited(agent, "server")
        agent.close()
        kill_runs(settings.runs_dir)
        remove_cgroups(cgroup_root)


UDPLITE_SERVER = """
import os, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 136)
s.bind(('127.0.0.1', 0))
s.settimeout(0.5)
tmp = os.path.join(sys.argv[1], 'port.tmp')
with open(tmp, 'w') as f:
    f.write(str(s.getsockname()[1]))
os.chmod(tmp, 0o644)
os.rename(tmp, os.path.join(sys.argv[1], 'port'))
end = time.time() + 60
while time.time() < end:
    try:
        data, peer = s.recvfrom(100)
        s.sendto(b'hi', peer)
    except OSError:
        pass
"""

UDPLITE_CLIENT = """
import socket, sys
port = int(open(sys.argv[1] + '/port').read())
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 136)
s.settimeout(2)
s.sendto(b'x', ('127.0.0.1', port))
try:
    print('CONNECT', s.recvfrom(100)[0].decode(), flush=True)
except OSError as e:
    print('CONNECT', type(e).__name__, flush=True)
"""


@needs_root
def test_a_protocol_nft_cannot_judge_by_socket_is_dropped_between_tenants(tmp_path: Path, shared: Path) -> None:
    """nft's socket lookup knows TCP and UDP only: another tenant's UDP-Lite reached a job's
    UDP-Lite socket (red team s21). A tenant's packets of such protocols delivered on the
    machine are dropped; TCP and UDP are judged as above."""
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root)
    settings.home.mkdir(mode=0o711)
    agent = _agent(settings)
    try:
        try:
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 136).close()
        except OSError:
            pytest.skip("no UDP-Lite in this kernel")
        server = JobSpec(command=["python", "-c", UDPLITE_SERVER, str(shared)])
        agent.launch(LaunchRequest("server", 1, "t", server, Allocation.single("n0"), "", run_as=ALICE))
        deadline = time.monotonic() + 30
        while not (shared / "port").exists():
            assert time.monotonic() < deadline, Path(agent.log_path("server")).read_text()
            time.sleep(0.1)
        spec = JobSpec(command=["python", "-c", UDPLITE_CLIENT, str(shared)])
        agent.launch(LaunchRequest("bob", 1, "t", spec, Allocation.single("n0"), "", run_as=BOB))
        assert wait_exited(agent, "bob").exit_code == 0
        log = Path(agent.log_path("bob")).read_text()
        assert "CONNECT TimeoutError" in log, log
    finally:
        agent.stop("server", 1, checkpoint=False)
        wait_exited(agent, "server")
        agent.close()
        kill_runs(settings.runs_dir)
        remove_cgroups(cgroup_root)


@needs_root
def test_turning_the_fence_off_deletes_the_table_it_left(tmp_path: Path) -> None:
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root)
    settings.home.mkdir(mode=0o711)
    agent = _agent(settings)
    table, nft = agent.net_fence.table, agent.net_fence.nft
    group, mount = agent.groups.net.group, agent.groups.net.mount  # type: ignore[union-attr]
    try:
        agent.close()
        # The table as an agent that left a fenced job running keeps it.
        assert net_fence(group, mount).available
        assert table in _nft(nft, "list", "tables", "inet").stdout
        agent = NodeAgent("n0", settings.runs_dir, settings=settings.model_copy(update={"net_fence": "off"}))
        assert not agent.net_fence.available and "net_fence=off" in agent.net_fence.missing
        assert table not in _nft(nft, "list", "tables", "inet").stdout
    finally:
        agent.close()
        kill_runs(settings.runs_dir)
        remove_cgroups(cgroup_root)


@needs_root
def test_a_run_s_tables_are_found_by_its_cgroup_root_when_its_node_groups_are_gone() -> None:
    """Tests (and embedded benchmark planes) use a cgroup root of their own; a table kept for a
    job that ran on was left on the machine when the node's groups were already gone."""
    from sluice.agent.cgroup import SYSFS_CGROUP
    from sluice.agent.net_fence import drop_tables_under

    root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    mount = SYSFS_CGROUP / "unified"
    fence = net_fence(mount / root / "n0", mount)  # no such folder: the table is all there is
    if not fence.available:
        pytest.skip(fence.missing)
    other = net_fence(mount / f"{root}-other" / "n0", mount)
    try:
        assert drop_tables_under(root) == [fence.table]
        listed = _nft(fence.nft, "list", "tables", "inet").stdout
        assert fence.table not in listed and other.table in listed
    finally:
        other.close(jobs_running=False)


@needs_root
def test_removing_a_root_drops_its_tables_only_once_no_job_is_left_in_it() -> None:
    """Test sessions and embedded planes end with `remove_root`; it left their tables (and
    the uid maps in them) on the machine. A group still holding a process keeps its fence."""
    from sluice.agent.cgroup import SYSFS_CGROUP, remove_root

    root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    mount = SYSFS_CGROUP / "unified"
    if not (mount / "cgroup.procs").exists():
        pytest.skip("no cgroup v2 tree at /sys/fs/cgroup/unified")
    group = mount / root / "n0" / "job"
    group.mkdir(parents=True)
    fence = net_fence(group.parent, mount)
    if not fence.available:
        remove_root(root)
        pytest.skip(fence.missing)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (group / "cgroup.procs").write_text(str(proc.pid))
        remove_root(root, wait_s=0.2)
        assert group.is_dir(), "a group with a process in it was removed"
        assert fence.table in _nft(fence.nft, "list", "tables", "inet").stdout
    finally:
        proc.kill()
        proc.wait()
    remove_root(root)
    assert not (mount / root).exists()
    assert fence.table not in _nft(fence.nft, "list", "tables", "inet").stdout
