"""The GPU fence in the real kernel (agent/gpu_fence.py, agent/bpf_device.py): a job opens only
the GPUs it was given, a job with none opens no NVIDIA device, and a tenant's job cannot
leave the fence.

The device files are real character devices (made with mknod, with the NVIDIA driver's major
195, and 241, free here, for its UVM) opened by real jobs under the real device cgroup. A
device the fence refuses answers EPERM before any driver is asked; one it lets through
answers what it answers outside any fence (`outside`): ENXIO ("no such device") with no
driver loaded, as on CI, and on a machine with an NVIDIA driver whatever the driver says
(open, ENODEV). Which minor is which GPU comes from a FAKE driver table (a GpuTable built
here, as /proc/driver/nvidia/gpus would give it), with minors that differ from the GPU
indices."""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.agent import bpf_device
from sluice.agent.gpu_fence import DeviceFence, FenceKind, FencePlan, FenceSupport, GpuDevice, GpuTable
from sluice.agent.node_agent import NodeAgent
from sluice.model import Allocation, JobUser, LaunchRequest
from sluice.settings import Settings
from sluice.spec import JobSpec
from tests.integration.conftest import kill_runs, remove_cgroups, wait_exited
from tests.isolating import needs_root

USER = JobUser(231_101, 231_101)
UVM_MAJOR = 241  # "local/experimental use": no driver has it here
TABLE = GpuTable(
    gpus=(GpuDevice(0, "0000:01:00.0", "GPU-aaaa", 1), GpuDevice(1, "0000:02:00.0", "GPU-bbbb", 0)),
    majors=(195, UVM_MAJOR),
)
"""A FAKE driver table: GPU 0 is /dev/nvidia1 and GPU 1 is /dev/nvidia0."""
NODES = {"nvidia0": (195, 0), "nvidia1": (195, 1), "nvidiactl": (195, 255), "nvidia-uvm": (UVM_MAJOR, 0)}

PROBE = """
import errno, json, os, sys
d = sys.argv[1]
opened = {}
for name in sorted(os.listdir(d)):
    try:
        os.close(os.open(os.path.join(d, name), os.O_RDWR))
        opened[name] = 'open'
    except OSError as e:
        opened[name] = errno.errorcode[e.errno]
escapes = {}
for target in ('/sys/fs/cgroup/devices/cgroup.procs', '/sys/fs/cgroup/unified/cgroup.procs'):
    try:
        with open(target, 'w') as f:
            f.write(str(os.getpid()))
        escapes[target] = 'moved'
    except OSError as e:
        escapes[target] = errno.errorcode[e.errno]
try:
    os.mknod(os.path.join(os.environ['HOME'], 'mine'), 0o20666, os.makedev(195, 0))
    made = 'made'
except OSError as e:
    made = errno.errorcode[e.errno]
print('FENCE ' + json.dumps({'open': opened, 'cuda': os.environ['CUDA_VISIBLE_DEVICES'],
    'gpus': os.environ['SLUICE_GPUS'], 'escapes': escapes, 'mknod': made}), flush=True)
"""


@pytest.fixture
def devices() -> Iterator[Path]:
    """Real device files, every uid's (as the NVIDIA driver makes them), where a job can reach them."""
    d = Path(tempfile.mkdtemp(prefix="sluice-fence-", dir="/tmp"))
    d.chmod(0o755)
    try:
        for name, (major, minor) in NODES.items():
            os.mknod(d / name, 0o666 | 0o020000, os.makedev(major, minor))
            os.chmod(d / name, 0o666)
        os.symlink("/dev/zero", d / "zero")  # an unrelated device: never fenced
    except PermissionError:
        shutil.rmtree(d)
        pytest.skip("needs to make device files (root)")
    yield d
    shutil.rmtree(d)


def outside(devices: Path) -> dict[str, str]:
    """What each device file answers with no fence: what a let-through device must answer."""
    got = {}
    for name in sorted(os.listdir(devices)):
        try:
            os.close(os.open(devices / name, os.O_RDWR))
            got[name] = "open"
        except OSError as e:
            got[name] = errno.errorcode.get(e.errno or 0, str(e.errno))
    assert "EPERM" not in got.values(), got
    return got


def _groups_named(cgroup_root: str, name: str) -> list[Path]:
    """Every cgroup called `name` under `cgroup_root`, in each hierarchy (v1 and v2)."""
    base = Path("/sys/fs/cgroup")
    tops = [base / cgroup_root, *(d / cgroup_root for d in base.iterdir() if d.is_dir() and not d.is_symlink())]
    return [p for t in tops if t.is_dir() for p in t.rglob(name)]


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgent]:
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root)
    settings.home.mkdir(mode=0o711)
    a = NodeAgent("n0", settings.runs_dir, settings=settings, gpus=["0", "1"], gpu_table=TABLE)
    yield a
    a.close()
    kill_runs(settings.runs_dir)
    remove_cgroups(cgroup_root)


def _probe(agent: NodeAgent, job_id: str, devices: Path, gpus: int) -> dict[str, Any]:
    spec = JobSpec(command=["python", "-c", PROBE, str(devices)])
    agent.launch(LaunchRequest(job_id, 1, "t", spec, Allocation.single("n0", gpus=gpus), "", run_as=USER))
    ended = wait_exited(agent, job_id)
    log = Path(agent.log_path(job_id)).read_text()
    assert ended.exit_code == 0, log
    line = next(ln for ln in log.splitlines() if ln.startswith("FENCE "))
    return dict(json.loads(line.removeprefix("FENCE ")))


@needs_root
def test_a_job_opens_only_its_own_gpu_and_sees_it_as_device_0(agent: NodeAgent, devices: Path) -> None:
    if agent.fence.kind is FenceKind.NONE:
        pytest.skip(f"no device fence on this host: {agent.fence.reason}")
    # A job holds GPU 0, so the probe is given GPU 1: /dev/nvidia0 in the fake table.
    hold = JobSpec(command=["python", "-c", "import time; time.sleep(60)"])
    agent.launch(LaunchRequest("hold", 1, "t", hold, Allocation.single("n0", gpus=1), "", run_as=USER))
    try:
        got = _probe(agent, "probe", devices, gpus=1)
    finally:
        agent.stop("hold", 1, checkpoint=False)
    free = outside(devices)
    assert got["open"] == {
        "nvidia0": free["nvidia0"],  # its own GPU: let through (to the driver, if any)
        "nvidia1": "EPERM",  # GPU 0, the other job's: refused by the kernel
        "nvidiactl": free["nvidiactl"],
        "nvidia-uvm": free["nvidia-uvm"],
        "zero": "open",
    }, got
    # Inside the fence CUDA counts only the GPUs the job can open: its one GPU is device 0.
    assert (got["cuda"], got["gpus"]) == ("0", "1")
    # The tenant's job can neither leave the fence nor make itself another way in.
    assert set(got["escapes"].values()) <= {"EACCES", "ENOENT"}, got
    assert got["mknod"] == "EPERM"


@needs_root
def test_a_job_without_gpus_opens_no_nvidia_device(agent: NodeAgent, devices: Path) -> None:
    if agent.fence.kind is FenceKind.NONE:
        pytest.skip(f"no device fence on this host: {agent.fence.reason}")
    got = _probe(agent, "cpu-only", devices, gpus=0)
    assert got["open"] == {
        "nvidia0": "EPERM",
        "nvidia1": "EPERM",
        "nvidiactl": "EPERM",
        "nvidia-uvm": "EPERM",
        "zero": "open",
    }, got
    assert (got["cuda"], got["gpus"]) == ("", "")
    assert agent.info().labels["gpu-fence"] == agent.fence.kind.name.lower()


@needs_root
def test_with_the_fence_off_a_job_opens_every_gpu(tmp_path: Path, devices: Path) -> None:
    """The setting's other value does what it says (and shows why the fence is needed)."""
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root, gpu_fence="off")
    settings.home.mkdir(mode=0o711)
    a = NodeAgent("n0", settings.runs_dir, settings=settings, gpus=["0", "1"], gpu_table=TABLE)
    try:
        assert a.fence.kind is FenceKind.NONE and "gpu_fence=off" in a.fence.reason
        got = _probe(a, "open", devices, gpus=1)
        free = outside(devices)
        assert (got["open"]["nvidia0"], got["open"]["nvidia1"]) == (free["nvidia0"], free["nvidia1"]), got
        assert (got["cuda"], got["gpus"]) == ("0", "0")  # the machine's numbering: no fence
    finally:
        a.close()
        kill_runs(settings.runs_dir)
        remove_cgroups(cgroup_root)


def _unified() -> Path | None:
    for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (mount / "cgroup.procs").exists() and (mount / "cgroup.controllers").exists():
            return mount
    return None


@needs_root
def test_the_cgroup_v2_device_program_refuses_what_it_names(devices: Path) -> None:
    """The eBPF path, on this kernel's cgroup v2 tree (on a hybrid host, the `unified` one a
    v2 layout would use): a process in the group is refused the named devices, the rest open."""
    mount = _unified()
    if mount is None or bpf_device.unavailable() is not None:
        pytest.skip("no cgroup v2 tree, or the kernel refuses device programs")
    group = mount / f"sluice-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        fence = DeviceFence(
            FenceSupport(FenceKind.BPF), group.name, FencePlan(((195, 1), (UVM_MAJOR, None)), ("0",)), group
        )
        assert fence.create() == (str(group / "cgroup.procs"),)
        code = (
            "import errno, os, sys\n"
            "open(sys.argv[2], 'w').write(str(os.getpid()))\n"
            "for n in sorted(os.listdir(sys.argv[1])):\n"
            "    try: os.close(os.open(os.path.join(sys.argv[1], n), os.O_RDWR)); print(n, 'open')\n"
            "    except OSError as e: print(n, errno.errorcode[e.errno])\n"
        )
        out: str = subprocess.run(
            [sys.executable, "-c", code, str(devices), str(group / "cgroup.procs")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        free = outside(devices)
        seen = {name: answer for name, answer in (line.split() for line in out.splitlines())}
        assert seen == {
            "nvidia-uvm": "EPERM",
            "nvidia0": free["nvidia0"],
            "nvidia1": "EPERM",
            "nvidiactl": free["nvidiactl"],
            "zero": "open",
        }, out
    finally:
        deadline = time.monotonic() + 5
        while group.exists() and time.monotonic() < deadline:
            try:
                group.rmdir()
            except OSError:
                time.sleep(0.05)


def test_the_shim_does_not_start_a_job_outside_its_fence(tmp_path: Path) -> None:
    """A fence the shim cannot enter means no job: its CUDA_VISIBLE_DEVICES counts the GPUs
    inside the fence, and outside it those numbers are other GPUs."""
    adir = tmp_path / "attempt"
    adir.mkdir()
    marker = tmp_path / "ran"
    argv = [
        sys.executable,
        "-m",
        "sluice.agent.shim",
        "--attempt-dir",
        str(adir),
        "--log",
        str(tmp_path / "log"),
        "--cwd",
        str(tmp_path),
        "--fence",
        str(tmp_path / "no-such-group" / "cgroup.procs"),
        "--",
        sys.executable,
        "-c",
        f"open({str(marker)!r}, 'w')",
    ]
    assert subprocess.run(argv, check=False, timeout=60).returncode == 127
    record = json.loads((adir / "exit_code").read_text())
    assert record["exit_code"] == 127 and "GPU fence" in record["reason"]
    assert not marker.exists()
    assert "could not enter the job's GPU fence" in (tmp_path / "log").read_text()


LEFTOVER = """
import os, sys, time
if os.fork() == 0:
    os.setsid()  # out of the attempt's process group: the killpg at its end misses it
    if os.fork() == 0:
        with open(sys.argv[1], 'w') as f:
            f.write(str(os.getpid()))
        time.sleep(120)  # would keep the fence of a GPU that goes to the next job
    os._exit(0)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


@needs_root
def test_a_job_s_leftover_that_left_its_process_group_dies_with_the_attempt(agent: NodeAgent, tmp_path: Path) -> None:
    """Red team (s21): a process of the job that called setsid() outlived the attempt, kept
    the attempt's fence (so it could open the GPU handed next to another tenant's job) and
    kept its device group from being removed. Everything in the attempt's groups is killed."""
    if agent.fence.kind is FenceKind.NONE:
        pytest.skip(f"no device fence on this host: {agent.fence.reason}")
    out = Path(tempfile.mkdtemp(prefix="sluice-leftover-", dir="/tmp"))
    out.chmod(0o777)
    try:
        pid_file = out / "pid"
        spec = JobSpec(command=["python", "-c", LEFTOVER, str(pid_file)])
        agent.launch(LaunchRequest("left", 1, "t", spec, Allocation.single("n0", gpus=1), "", run_as=USER))
        assert wait_exited(agent, "left").exit_code == 0
        pid = int(pid_file.read_text())
        alive = Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()
        if alive:
            os.kill(pid, 9)
        assert not alive, "a process of the ended attempt still runs, inside its GPU fence"
        # v1: the attempt's devices group; v2: its own group, which holds the device program.
        assert agent.settings.cgroup_root is not None
        assert _groups_named(agent.settings.cgroup_root, "left.1") == []
    finally:
        shutil.rmtree(out)


@needs_root
def test_the_largest_device_program_loads() -> None:
    """Red team (s21): the verifier's log of a program of a few hundred rules outgrew its
    buffer and the kernel refused the load (ENOSPC), well under MAX_RULES."""
    if bpf_device.unavailable() is not None:
        pytest.skip("the kernel refuses device programs")
    for rules in ([(195, m) for m in range(bpf_device.MAX_RULES)], [(m, None) for m in range(bpf_device.MAX_RULES)]):
        os.close(bpf_device.load(rules))


@needs_root
def test_no_fence_replaces_a_device_policy_attached_above_it(tmp_path: Path) -> None:
    """Red team (s21): under a group whose device program was attached with
    BPF_F_ALLOW_OVERRIDE, the fence's program ran *instead of* it, and a job could open a
    device the host's own policy refused (here /dev/zero). Under one attached with no flag
    the attach failed at every launch while the node said its jobs were fenced."""
    mount = _unified()
    if mount is None or bpf_device.unavailable() is not None:
        pytest.skip("no cgroup v2 tree, or the kernel refuses device programs")
    root = mount / f"sluice-test-{uuid.uuid4().hex[:8]}"
    job = root / "job"
    job.mkdir(parents=True)
    try:
        for flags in (1, 0):  # BPF_F_ALLOW_OVERRIDE, then none
            policy = bpf_device.load([(1, 5)])  # the host refuses /dev/zero
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                bpf_device._bpf(8, struct.pack("<IIIII", fd, policy, 6, flags, 0))
                assert bpf_device.unavailable(root) is not None
                with pytest.raises(bpf_device.BpfUnavailable, match="ALLOW_MULTI"):
                    bpf_device.attach(job, [(195, None)])
            finally:
                bpf_device._bpf(9, struct.pack("<IIIII", fd, policy, 6, 0, 0))  # detach
                os.close(fd)
                os.close(policy)
        assert bpf_device.unavailable(root) is None
        bpf_device.attach(job, [(195, None)])  # with nothing above, it attaches
    finally:
        job.rmdir()
        root.rmdir()


@needs_root
def test_a_restarted_agent_removes_the_fence_of_an_attempt_it_adopted(tmp_path: Path) -> None:
    """The fence group is removed by whichever agent sees the attempt end, also one started
    with the fence turned off meanwhile (red team s21: it read its own setting and left the
    group behind)."""
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path / "home", cgroup_root=cgroup_root)
    settings.home.mkdir(mode=0o711)
    first = NodeAgent("n0", settings.runs_dir, settings=settings, gpus=["0", "1"], gpu_table=TABLE)
    second = None
    try:
        if first.fence.kind is not FenceKind.V1:
            pytest.skip(f"no v1 devices controller here: {first.fence.describe()}")
        spec = JobSpec(command=["python", "-c", "import time; time.sleep(3)"])
        first.launch(LaunchRequest("slow", 1, "t", spec, Allocation.single("n0"), "", run_as=USER))
        group = first._watched[("slow", 1)].fence.dir  # type: ignore[union-attr]
        assert group is not None and group.is_dir()
        first.close()  # the job keeps running; a new agent adopts it
        off = settings.model_copy(update={"gpu_fence": "off"})
        second = NodeAgent("n0", settings.runs_dir, settings=off, gpus=["0", "1"], gpu_table=TABLE)
        assert second.fence.kind is FenceKind.NONE
        assert wait_exited(second, "slow").exit_code == 0
        assert not group.exists()
    finally:
        (second or first).close()
        kill_runs(settings.runs_dir)
        remove_cgroups(cgroup_root)
