"""NodeAgent: runs job attempts on one (virtual) node and reports what happens to them.

Everything needed to find an attempt again lives on disk, under `runs_dir`:

    runs_dir/<job_id>/job.log               one log per job, appended across attempts
                                            (and by every replica of a gang: `log_job`)
    runs_dir/<job_id>/attempt-<n>/
        state.json      node, shim pid + create time, cgroup name, current limits
        progress.jsonl  written by sluice.sdk inside the job (SLUICE_RUN_DIR)
        child.json      the job process's pid (written by the shim)
        stop.json       the stop sluice asked for (signal, deadline), so the reason survives
        exit_code       written atomically by the shim when the job ends
        exit_reported   marker: a controller has the exit (written at the poll after
                        the one that told it: see below)

So a new agent — after a control-plane crash — adopts attempts whose shim still runs (pid
AND process create time must match, a recycled pid is not our job) and reports, once, the
exit of attempts that ended while nobody watched.

An exit is marked reported only at the poll *after* the one that told it: a controller polls
again only once it has applied (stored) what the last poll told, so a plane killed in between
leaves the attempt unmarked, and the next agent adopts it and tells its exit again (a crash
campaign found the window: the exit marked, the plane killed before it stored it, and the job
run once more as "process gone" without its retry counted). A controller ignores an exit it
already has (the job ended, or is on another attempt). An agent that outlives its plane (Ray's
detached actors) tells the new plane again what it told last (`retell`).

The poll path is built to be cheap with many jobs: per attempt one waitpid (or a /proc stat
read for adopted ones), one `stat` of progress.jsonl plus only the appended bytes, and one
cgroup counter read per usage interval. No process spawning, no scans of all processes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import psutil

from sluice.agent import landlock
from sluice.agent.cache_report import CacheReporter
from sluice.agent.cgroup import (
    SYSFS_CGROUP,
    CgroupLayout,
    CoreLedger,
    CpuController,
    JoinSpec,
    MemoryController,
    cgroup_name,
    detect_cgroups,
    kill_members,
    node_cpuset,
    warn_once,
)
from sluice.agent.disk_watch import MIB, DiskWatch, FolderSize, Watched, folder_size, job_pids
from sluice.agent.faults import FaultBoard, FaultReport
from sluice.agent.gpu_fence import (
    DeviceFence,
    FenceKind,
    FencePlan,
    FenceSupport,
    GpuTable,
    detect_fence,
    plan_fence,
    read_gpu_table,
    with_current_majors,
)
from sluice.agent.isolation import (
    PLANE_DIR_MODE,
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    UnsafeFolder,
    confined_dir,
    launch_problem,
    own_dir,
    own_file,
    plane_dirs,
    plane_owned,
)
from sluice.agent.kpi import KpiSampler
from sluice.agent.launchenv import LaunchError, build_env, resolve_argv, resolve_workdir
from sluice.agent.net_fence import NetFence, net_fence
from sluice.agent.node_cgroup import group_dirs, node_groups, remove_groups, warn_missing
from sluice.agent.node_net import NodeNetV2
from sluice.agent.node_owners import NodeOwners
from sluice.agent.progress_record import progress_event, thin
from sluice.agent.shim import CHILD_FILE, ENV_FILE, EXIT_FILE, process_start_ticks, shim_env, write_json_atomic
from sluice.agent.tail import JsonlTail
from sluice.agent.tenant_cache import claim_tiers, drop_everywhere, tenant_job_env, tenant_share, warm_as
from sluice.data.cache import DatasetCache
from sluice.data.guard import guard_from
from sluice.data.settings import CacheSettings
from sluice.data.warm import WarmReport, warm_node
from sluice.model import (
    Allocation,
    Event,
    JobExited,
    JobStarted,
    JobUsage,
    JobUser,
    LaunchRequest,
    NodeInfo,
    NodeKPIs,
    runfolder,
)
from sluice.settings import Settings

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
STOP_FILE = "stop.json"
REPORTED_FILE = "exit_reported"
PROGRESS_FILE = "progress.jsonl"
WORK_DIR = runfolder.WORK_DIR
"""The job's default working folder (and HOME under isolation), inside its run folder."""
CREATE_TIME_TOLERANCE_S = 1.0
"""psutil's create time has clock-tick resolution; a recycled pid starts much later."""
FINAL_WALK_WAIT_S = 0.5
"""How long a poll waits for the walks of attempts that just ended, all of them together (most
take milliseconds); a longer one goes on in its thread and the attempt's exit is told at a
later poll."""


@dataclass
class _Attempt:
    job_id: str
    attempt: int
    dir: Path
    shim_pid: int
    shim_create: float
    ctrl: CpuController
    tail: JsonlTail
    mem: MemoryController | None = None
    fence: DeviceFence | None = None
    popen: subprocess.Popen[bytes] | None = None
    proc: psutil.Process | None = None
    child: psutil.Process | None = None
    stop_deadline: float | None = None
    stop_signal: str | None = None
    last_usage: tuple[float, float] | None = None
    next_usage: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    log_job: str = ""
    """The job whose log this attempt writes to (a gang's replicas share their job's)."""
    final_walk: Future[FolderSize] | None = None
    """The walk of its folders begun as it ended (`NodeAgent._final_walk_done`); its exit is told
    once the walk is done."""

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return _running(self.proc) or (self.proc is None and _running(self.child))


def _running(p: psutil.Process | None) -> bool:
    if p is None:
        return False
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _same_process(pid: int, create_time: float) -> psutil.Process | None:
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - create_time) <= CREATE_TIME_TOLERANCE_S and p.status() != psutil.STATUS_ZOMBIE:
            return p
    except psutil.Error:
        pass
    return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def note_attempt_start(log_file: Path, attempt: int) -> None:
    """Record where `attempt`'s output starts in `log_file` (runfolder.JOB_LOG_INDEX beside it),
    before anything of it is written: a read of a job that ran on a node twice, with another
    node between, cuts that node's log there and puts its attempts in order. The plane's own
    file (0600, never through a link); a record that cannot be written costs only the order."""
    try:
        offset = log_file.stat().st_size
        fd = os.open(
            log_file.with_name(runfolder.JOB_LOG_INDEX),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            PRIVATE_FILE_MODE,
        )
        try:
            os.write(fd, f"{attempt} {offset}\n".encode())
        finally:
            os.close(fd)
    except OSError as err:
        log.warning("could not record where attempt %d starts in %s: %s", attempt, log_file, err)


def _join_both(ctrl: CpuController, mem: MemoryController | None, node: tuple[str, ...] = ()) -> JoinSpec:
    """What the shim joins: the CPU side's cgroups (or cores) plus the memory cgroup, plus the
    node's own groups where the job has none of its own (`node`), each procs file once (on
    v2 both controllers live in the same directory)."""
    spec = ctrl.join_spec()
    extra = (*(mem.procs_files() if mem is not None else ()), *node)
    if not extra:
        return spec
    files = tuple(dict.fromkeys((*spec.procs_files, *extra)))
    return JoinSpec(files, spec.cpus)


def default_node_name() -> str:
    return socket.gethostname().split(".")[0] or "local"


def _mark(path: Path, data: dict[str, Any] | None) -> None:
    """Write one of an attempt's plane files (`data` None: an empty marker) unless its folder is
    gone: a job can end before its node sees its processes go (an internal error fails it, its
    node is lost) and be deleted at once (`sluice job delete`), its folders with it. There is
    nothing left there to mark or adopt; raised, it failed every poll of the node (on the local
    engine every round of the plane)."""
    try:
        if data is None:
            own_file(path, None)
        else:
            write_json_atomic(path, data)
    except FileNotFoundError:
        if path.parent.exists():
            raise
        log.info("not writing %s: the attempt's folder is gone (its job was deleted)", path)


def _counts_gang_folder(att: _Attempt) -> bool:
    """Whether the attempt's disk report counts its gang's folder (its one log, its checkpoints),
    which every replica of a gang on this engine measures with its own: only rank 0's does, so
    the gang's sum (engine/ray_gang.py) holds it once, not once a replica."""
    return not att.log_job or att.log_job == att.job_id or att.job_id.startswith(f"{att.log_job}--r0of")


class NodeAgent:
    """The per-node mechanism: the local engine holds one per (virtual) node in process, the
    Ray engine wraps one in an actor on every Ray node (agent/ray_actor.py). Same class, same
    calls."""

    def __init__(
        self,
        name: str,
        runs_dir: str | Path,
        cpus: Sequence[int] | None = None,
        settings: Settings | None = None,
        *,
        cpu: float | None = None,
        layout: CgroupLayout | None = None,
        gpus: int | Sequence[str] = (),
        memory_mb: int | None = None,
        labels: dict[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        guard_pid: int | None = None,
        cache: CacheSettings | None = None,
        gpu_table: GpuTable | None = None,
        disk_watch: DiskWatch | None = None,
    ) -> None:
        """`cpus`: the cores this node's jobs may run on (default: all of this machine's);
        `cpu`: cores offered to the scheduler (default settings.node_cpus, else len(cpus));
        `gpus`: GPU ids (or a count) handed out through CUDA_VISIBLE_DEVICES;
        `guard_pid`: a process whose life is this node's (the raylet on Ray): every job's
        shim kills its job when that process is gone (see sluice.agent.shim);
        `cache`: this node's dataset cache (default settings.cache, the home's): the folders
        `warm_dataset`, `drop_dataset` and the cache reports work on, and the ones every job
        that reads datasets is pointed at (SLUICE_CACHE_DISK_DIR/MEMORY_DIR) at launch;
        `gpu_table`: the driver's GPUs (default: read from /proc; tests pass a fake one);
        `disk_watch`: the watch of this node's disk when other nodes share it (virtual nodes;
        the engine starts and closes it), else the agent makes and runs its own."""
        self.settings = settings or Settings()
        self.cache_settings = cache or self.settings.cache
        self.name = name
        self.runs_dir = own_dir(plane_dirs(Path(runs_dir)), PLANE_DIR_MODE)  # job ids are not for listing
        machine = len(os.sched_getaffinity(0))
        self.cpus = tuple(sorted(cpus if cpus is not None else os.sched_getaffinity(0)))
        self.offered_cpu = float(cpu or self.settings.node_cpus or len(self.cpus))
        self.gpus = [str(g) for g in range(gpus)] if isinstance(gpus, int) else list(gpus)
        self.labels = dict(labels or {})
        self.clock = clock
        self.guard: tuple[int, int] | None = None
        if guard_pid is not None:
            start = process_start_ticks(guard_pid)
            if start is None:
                raise LaunchError(f"guard process {guard_pid} does not exist: this node is already gone")
            self.guard = (guard_pid, start)
        self.layout = layout or detect_cgroups(root=self.settings.cgroup_root, cpuset=len(self.cpus) < machine)
        warn_once(self.layout)
        # The node's own cgroups: its jobs' cgroups are made inside them, faults run in them,
        # and the node's KPIs are read from them (agent/node_cgroup.py). Recorded as this
        # process's, so that if it is killed the next agent here removes them when empty
        # (and removes those of agents killed before: agent/node_owners.py).
        parents = (self.layout.cpu_parent, self.layout.memory_parent, self.layout.cpuset_parent)
        real = any(p is not None and SYSFS_CGROUP in p.parents for p in parents)  # not a test's fake tree
        self.owners = NodeOwners() if real else None
        with self._claiming(name) as record:
            virtual = len(self.cpus) < machine
            self.cpuset = node_cpuset(self.layout, name, self.cpus) if virtual else None
            self.groups = node_groups(
                self.layout, name, root=self.settings.cgroup_root, cpus=self.cpus if virtual else None
            )
            record(group_dirs(self.groups, self.layout, self.cpuset))
        warn_missing(self.groups)
        self.layout = self.groups.layout
        self.gpu_table = gpu_table or read_gpu_table(self.gpus)
        self.fence = (
            detect_fence(self.layout, self.settings.cgroup_root, enabled=self.settings.gpu_fence == "auto")
            if real
            else FenceSupport(FenceKind.NONE, reason="this node's jobs have no cgroups of their own")
        )
        if self.gpus:
            (log.info if self.fence.kind is not FenceKind.NONE else log.warning)("%s: %s", name, self.fence.describe())
        v2net = self.groups.net if isinstance(self.groups.net, NodeNetV2) and not self.groups.net.missing else None
        self.net_fence: NetFence = net_fence(
            v2net.group if v2net is not None else None,
            v2net.mount if v2net is not None else None,
            enabled=self.settings.net_fence == "auto",
        )
        self.unix_fence_missing = (
            "turned off (setting unix_fence=off)" if self.settings.unix_fence == "off" else landlock.missing()
        )
        """Why this node's jobs are not in a Landlock domain of their own (agent/landlock.py), or ""."""
        self.ledger = CoreLedger(self.cpus)
        total_mb = psutil.virtual_memory().total // (1024 * 1024)
        self.memory_mb = memory_mb if memory_mb else int(total_mb * len(self.cpus) / max(machine, 1))
        self._lock = threading.RLock()
        self._watched: dict[tuple[str, int], _Attempt] = {}
        self._pending: list[Event] = []
        self._told: list[tuple[Path, JobExited]] = []
        """Exits the last poll returned, with their attempt folders: marked reported at the next
        poll (the caller has stored them by then), or told again after `retell`."""
        self._retold: list[tuple[Path, JobExited]] = []
        self._gpu_holders: dict[str, tuple[str, int]] = {}
        self._kpis: KpiSampler | None = None
        self._next_kpi = 0.0
        self._cache = CacheReporter(name, self.cache_settings, job_python=self.settings.job_python)
        for problem in claim_tiers(self.cache_settings):  # before any job of this node runs
            log.error("%s on %s: jobs that read datasets will not start here", problem, name)
        self._cache.recover()
        self._warm_cache: DatasetCache | None = None
        """The node cache `warm_dataset` fills; opened on first use, kept (one per agent)."""
        self._warm_jails = itertools.count(1)
        """Numbers the warm helpers' memory cgroups (part of each one's name); `next` on it is
        atomic, so two warms of one tenant at once never share a group."""
        self._warned_warm_jail = False
        self._warm_mu = threading.Lock()
        self.faults = FaultBoard(name, self.cpus, join=self.groups.fault_join(self.cpuset))
        """Faults an operator injected here (`sluice node fault`); stopped on close."""
        self._adopt()
        self._own_disk_watch = disk_watch is None
        self.disk = disk_watch or DiskWatch(
            self.runs_dir, None, self.settings.disk_check_s, self.settings.disk_reserve_percent
        )
        """Measures the running jobs' run folders; poll() stops those over a bound (agent/disk_watch.py).
        The engine's, shared by the nodes on one disk, when it gives one."""
        self.disk.add(self._disk_watched)
        if self._own_disk_watch:
            self.disk.start()
        self._walker: ThreadPoolExecutor | None = None
        """Walks the folders of attempts that ended (`_final_walk_done`); made at the first."""
        self._walks_wait_until = 0.0
        """Monotonic time until which this poll waits for those walks (FINAL_WALK_WAIT_S a poll,
        however many attempts ended in it: ten large folders ending at once held one poll 5 s)."""

    # ------------------------------------------------------------------ facts
    def info(self) -> NodeInfo:
        labels = {
            "cpu-limits": str(self.layout.kind),
            "memory-limits": str(self.layout.memory_kind or "none"),
            "gpu-fence": "none" if self.fence.kind is FenceKind.NONE else self.fence.kind.name.lower(),
            "cores": ",".join(map(str, self.cpus)),
            **self.labels,
        }
        return NodeInfo(
            name=self.name, cpu=self.offered_cpu, gpus=len(self.gpus), memory_mb=self.memory_mb, labels=labels
        )

    def job_dir(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id in {".", ".."}:
            raise LaunchError(f"job_id {job_id!r} is not usable as a folder name")
        return self.runs_dir / job_id

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        return self.job_dir(job_id) / runfolder.attempt_name(attempt)

    def log_path(self, job_id: str) -> str:
        return str(self.job_dir(job_id) / runfolder.JOB_LOG)

    def controller(self, job_id: str, attempt: int) -> CpuController | None:
        """The CPU controller of a running attempt (tests and diagnostics read its limits)."""
        a = self._watched.get((job_id, attempt))
        return None if a is None else a.ctrl

    def child_pid(self, job_id: str, attempt: int) -> int | None:
        data = _read_json(self.attempt_dir(job_id, attempt) / CHILD_FILE)
        return None if data is None else int(data["pid"])

    # ------------------------------------------------------------------ launch
    def launch(self, req: LaunchRequest, *, log_job: str | None = None, prefix: str = "") -> None:
        """Start one attempt under its shim; JobStarted (or JobExited) follows from poll().

        A replica of a gang is launched as a job of its own (`req.job_id` names the replica)
        that writes into its gang's log: `log_job` names that job, `prefix` ("[rank1] ")
        starts each of its lines there."""
        with self._lock:
            key = (req.job_id, req.attempt)
            adir = self.attempt_dir(req.job_id, req.attempt)
            if key in self._watched or (adir / STATE_FILE).exists():
                raise LaunchError(f"attempt {req.attempt} of {req.job_id} was already launched")
            user = req.run_as
            jdir = plane_dirs(self.job_dir(req.job_id), stop=self.runs_dir)
            own_dir(adir, PLANE_DIR_MODE)
            log_job = log_job or req.job_id
            plane_dirs(self.job_dir(log_job), stop=self.runs_dir)  # a gang's: made by its first replica
            log_file = own_file(Path(self.log_path(log_job)), None)
            try:
                own_file(adir / PROGRESS_FILE, user)  # the one file of the attempt folder the job writes
                cwd = resolve_workdir(req, own_dir(jdir / WORK_DIR, PRIVATE_DIR_MODE, user))
                tmp = own_dir(jdir / runfolder.TMP_DIR, PRIVATE_DIR_MODE, user)
                gpus = self._take_gpus(req)
                plan = None
                if self.fence.kind is not FenceKind.NONE:
                    self.gpu_table = with_current_majors(self.gpu_table)
                    plan = plan_fence(self.gpu_table, gpus)
                env = build_env(
                    req,
                    run_dir=adir,
                    node=self.name,
                    node_cpus=min(self.offered_cpu, len(self.cpus)),
                    gpus=gpus,
                    home=self.settings.home,
                    job_home=jdir / WORK_DIR if user is not None else None,
                    net_interface=self.settings.net_interface,
                    visible=plan.visible if plan is not None else None,
                    tmp_dir=tmp,
                )
                self._node_cache_dirs(env)
                python = self.settings.job_python or sys.executable
                argv = resolve_argv(list(req.spec.command), cwd, env.get("PATH"), python=python)
                if user is not None:
                    problem = launch_problem(argv[0], cwd, user, python)
                    if problem is not None:
                        raise LaunchError(problem)
                    self._tenant_cache_dirs(env, user)
                self._prepare_checkpoint_dir(req.checkpoint_dir, user, req)
                mem = self._memory_limit(req)
            except (LaunchError, OSError) as err:
                self._release_gpus(req.job_id, req.attempt)
                # A LaunchError can never work as asked; an OSError (a full disk, say) might next time.
                self._fail_launch(req, adir, log_file, str(err), retryable=not isinstance(err, LaunchError))
                raise LaunchError(str(err)) from None
            a = req.allocation.assignments[0]
            ctrl = CpuController(
                self.layout,
                cgroup_name(req.job_id, req.attempt),
                self.cpus,
                node_cpuset=self.cpuset,
                ledger=self.ledger,
            )
            ctrl.create()
            ctrl.apply(a.cpu_limit, a.cpu_request)
            fence, fence_files = self._fence(req, adir, log_file, ctrl, mem, plan)
            net = self.groups.net.job_group(ctrl.name) if self.groups.net is not None else None
            fenced = self._net_fence(req, adir, log_file, ctrl, mem, fence, user) if user is not None else None
            if fenced is not None and fenced not in fence_files:
                # Its rules match the job's v2 group: a job that could not enter it would run
                # unfenced (unmarked, and its sockets open to every tenant). Joined, or no job.
                fence_files = (*fence_files, fenced)
            join = _join_both(ctrl, mem, (*self.groups.job_join(mem is not None), *([net] if net else [])))
            join = JoinSpec(tuple(f for f in join.procs_files if f not in fence_files), join.cpus)
            header = (
                f"===== sluice: attempt {req.attempt} of {req.job_id} on {self.name} at "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')} ({req.allocation.describe()}) ====="
            )
            write_json_atomic(adir / ENV_FILE, env)  # the job's, never the shim's own (shim.shim_env)
            note_attempt_start(log_file, req.attempt)
            shim_argv = [
                sys.executable,
                "-m",
                "sluice.agent.shim",
                "--env-file",
                str(adir / ENV_FILE),
                "--attempt-dir",
                str(adir),
                "--log",
                str(log_file),
                "--cwd",
                str(cwd),
                "--header",
                header,
                *(["--prefix", prefix] if prefix else []),
                *(arg for f in fence_files for arg in ("--fence", f)),
                *join.to_argv(),
                *(["--guard", f"{self.guard[0]}:{self.guard[1]}"] if self.guard else []),
                *(["--uid", str(user.uid), "--gid", str(user.gid)] if user is not None else []),
                *(["--unix-fence"] if user is not None and not self.unix_fence_missing else []),
                *(arg for name, value in self._rlimits(user).items() for arg in ("--rlimit", f"{name}={value}")),
                "--",
                *argv,
            ]
            popen = subprocess.Popen(
                shim_argv,
                env=shim_env(),
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
            ctrl.attach(popen.pid)
            proc = psutil.Process(popen.pid)
            now = self.clock()
            att = _Attempt(
                req.job_id, req.attempt, adir, popen.pid, proc.create_time(), ctrl, JsonlTail(adir / PROGRESS_FILE), mem
            )
            att.popen, att.proc, att.log_job, att.fence = popen, proc, log_job, fence
            att.next_usage = now + self.settings.usage_sample_s
            kept: dict[str, Any] = {"memory_mb": mem.limit_mb} if mem is not None else {}
            if req.spec.resources.disk_mb is not None:
                kept["disk_mb"] = req.spec.resources.disk_mb
            if fence is not None and fence.active and fence.support.kind is FenceKind.V1:
                kept["fence_dir"] = str(fence.dir)  # removed by whichever agent sees the end
            if user is not None and self.net_fence.available:
                kept["net_fence_uid"] = user.uid  # the next agent keeps its rules
            self._write_state(att, a.cpu_limit, a.cpu_request, launched_at=now, log_job=log_job, **kept)
            self._watched[key] = att
            self._pending.append(JobStarted(req.job_id, req.attempt, self.name, now, pid=popen.pid))

    def _fence(
        self,
        req: LaunchRequest,
        adir: Path,
        log_file: Path,
        ctrl: CpuController,
        mem: MemoryController | None,
        plan: FencePlan | None,
    ) -> tuple[DeviceFence | None, tuple[str, ...]]:
        """The attempt's GPU fence, made (agent/gpu_fence.py), and the procs files the shim
        must join. A fence the kernel refuses fails the launch, retryably: a job is never run
        unfenced on a node that fences."""
        if plan is None:
            return None, ()
        if plan.unfenced:
            with open(log_file, "a") as f:
                f.write(f"[sluice] warning: this job's GPUs are not fenced from the others: {plan.unfenced}\n")
        fence = DeviceFence(self.fence, ctrl.name, plan, ctrl.cpu_dir)
        try:
            return fence, fence.create()
        except OSError as err:
            self._undo_launch(req, adir, log_file, ctrl, mem, fence, f"GPU fence: {err.strerror or err}")

    def _net_fence(
        self,
        req: LaunchRequest,
        adir: Path,
        log_file: Path,
        ctrl: CpuController,
        mem: MemoryController | None,
        fence: DeviceFence | None,
        user: JobUser,
    ) -> str | None:
        """Fence the tenant's job from other tenants' sockets (agent/net_fence.py); rules nft
        refuses fail the launch, retryably, as the GPU fence does. The procs file of the v2
        group the rules match (the shim must join it), None where nothing is fenced."""
        if not self.net_fence.available or not isinstance(self.groups.net, NodeNetV2):
            return None
        group = self.groups.net.group
        try:
            if group is None:
                raise OSError("network fence: the node has no cgroup v2 group")
            self.net_fence.add(ctrl.name, group / ctrl.name, user.uid)
        except OSError as err:
            self.groups.net.drop_job(ctrl.name)
            self._undo_launch(req, adir, log_file, ctrl, mem, fence, str(err))
        assert group is not None
        return str(group / ctrl.name / "cgroup.procs")

    def _undo_launch(
        self,
        req: LaunchRequest,
        adir: Path,
        log_file: Path,
        ctrl: CpuController,
        mem: MemoryController | None,
        fence: DeviceFence | None,
        reason: str,
    ) -> NoReturn:
        """A launch that failed once its groups were made: remove them, give its GPUs back,
        record the failure (retryable: the kernel or nft may take it next time) and raise."""
        if fence is not None:
            fence.cleanup()
        ctrl.cleanup()
        if mem is not None:
            mem.cleanup()
        self._release_gpus(req.job_id, req.attempt)
        self._fail_launch(req, adir, log_file, reason, retryable=True)
        raise LaunchError(reason)

    def _memory_limit(self, req: LaunchRequest) -> MemoryController | None:
        """The attempt's memory cgroup, made and limited, when the job sets memory_mb.

        A node without a memory controller refuses the launch (the plane refuses such jobs at
        submit already; this is for a node that differs from the others): never run unlimited."""
        limit_mb = req.spec.resources.memory_mb
        if not limit_mb:
            return None
        if self.layout.memory_kind is None:
            raise LaunchError(
                f"resources.memory_mb: node {self.name} cannot enforce a memory limit ({self.layout.memory_reason})"
            )
        mem = MemoryController(self.layout, cgroup_name(req.job_id, req.attempt), limit_mb)
        try:
            mem.make()
        except OSError as err:
            raise LaunchError(f"resources.memory_mb: could not set a {limit_mb} MiB limit: {err}") from None
        return mem

    def _fail_launch(self, req: LaunchRequest, adir: Path, log_file: Path, reason: str, retryable: bool) -> None:
        note_attempt_start(log_file, req.attempt)
        with open(log_file, "a") as f:
            f.write(f"===== sluice: attempt {req.attempt} of {req.job_id} could not start: {reason}\n")
        write_json_atomic(adir / EXIT_FILE, {"exit_code": 127, "time": self.clock(), "reason": reason})
        own_file(adir / REPORTED_FILE, None)
        self._pending.append(
            JobExited(
                req.job_id, req.attempt, self.clock(), 127, reason=f"launch failed: {reason}", retryable=retryable
            )
        )

    def _prepare_checkpoint_dir(self, location: str, user: JobUser | None, req: LaunchRequest) -> None:
        """The checkpoint folder is the job's (0700, its uid); the folders above it that sluice
        makes are the plane's (0711: passable, not listable). A folder of the plane's own is
        never handed over (a LaunchError: every attempt would meet it), whatever the spec says.

        The folder is made by walking down from a trusted folder without following a symlink
        (isolation.confined_dir): for an absolute checkpoint.location, the admin's checkpoint
        root it must still lie in now (a job owns folders on the way and may have swapped one
        for a link since submit); else the plane's checkpoint root above `<job id>`."""
        if not location or "://" in location:
            return
        path = Path(os.path.abspath(location))
        problem = self._plane_folder(path)
        if problem is not None:
            raise LaunchError(
                f"checkpoint.location: {location} is {problem}; the plane never hands its own folders to a job"
            )
        base = self._checkpoint_base(path, req)
        try:
            os.close(confined_dir(base, path, user))
        except UnsafeFolder as err:
            raise LaunchError(f"checkpoint.location: {err}") from None

    def _checkpoint_base(self, path: Path, req: LaunchRequest) -> Path:
        """The trusted folder `path` (the job's checkpoint folder) is walked down from."""
        asked = req.spec.checkpoint.location
        if asked is not None and asked.lower().startswith("file://"):
            asked = asked[len("file://") :]
        if asked is not None and os.path.isabs(asked):
            roots = [r for r in self.settings.checkpoint_roots if "://" not in r]
            bases = {Path(os.path.realpath(r)) for r in roots} | {Path(os.path.abspath(r)) for r in roots}
            inside = sorted((b for b in bases if b in path.parents), key=lambda b: len(b.parts))
            if not inside:
                raise LaunchError(
                    f"checkpoint.location: {path} is not inside the storage roots the admin configured (setting "
                    f"checkpoint_roots: {', '.join(roots) or 'none are configured'}); the job is not launched"
                )
            return inside[-1]
        rest = ("checkpoints",) if asked is None else Path(os.path.normpath(asked)).parts
        parts = path.parts
        if len(parts) > len(rest) + 1 and parts[-len(rest) :] == rest and parts[-len(rest) - 1] == req.job_id:
            # The plane's checkpoint root, above <job id>: the plane's to make if missing (a
            # setting, not a job's path: `Controller(checkpoint_root=...)`, runs/ by default).
            return plane_dirs(Path(*parts[: -len(rest) - 1]))
        # A folder named by a caller other than the controller (tests, benchmarks): below
        # the nearest folder that exists, as a plain `mkdir -p` would.
        base = path.parent
        while not base.exists() and base.parent != base:
            base = base.parent
        return base

    def _plane_folder(self, path: Path) -> str | None:
        """What of the plane's `path` is (as written, and with the symlinks that exist now
        followed), or None for a folder that may become a job's: the runs folder, $SLUICE_HOME
        or a folder above either, a job's run folder, or one of the plane's names in it
        (attempt-<n>, job.log, work: model/runfolder.py) or below one."""
        homes = {Path(os.path.abspath(p)) for p in (self.runs_dir, self.settings.home)}
        homes |= {Path(os.path.realpath(p)) for p in homes}
        runs = {Path(os.path.abspath(self.runs_dir)), Path(os.path.realpath(self.runs_dir))}
        for p in (path, Path(os.path.realpath(path))):
            if any(p == h or p in h.parents for h in homes):
                return "the plane's runs folder, its home or a folder above them"
            for r in runs:
                if r not in p.parents:
                    continue
                parts = p.relative_to(r).parts
                if len(parts) == 1:
                    return f"the run folder of job {parts[0]}"
                what = runfolder.plane_name(parts[1])
                if what is not None:
                    return f"{parts[1]!r} of job {parts[0]}'s run folder ({what}) or a folder in it"
        return None

    def _rlimits(self, user: JobUser | None) -> dict[str, int]:
        """The job's rlimits (settings job_max_*); a process count only for a job uid of its own."""
        s = self.settings
        limits = {"nofile": s.job_max_open_files}
        if user is not None and s.job_max_processes is not None:
            limits["nproc"] = s.job_max_processes
        if s.job_max_file_mb is not None:
            limits["fsize"] = s.job_max_file_mb * 1024 * 1024
        if not s.job_core_dumps:
            limits["core"] = 0
        return limits

    def _node_cache_dirs(self, env: dict[str, str]) -> None:
        """A job that reads datasets (the plane gave it SLUICE_DATASETS) reads this node's cache:
        the folders this agent warms, empties and reports, whatever the plane put in the env
        (on Ray the plane's folders need not exist on this node; docs/data.md)."""
        if not {"SLUICE_DATASETS", "SLUICE_CACHE_DISK_DIR", "SLUICE_CACHE_MEMORY_DIR"} & env.keys():
            return
        c = self.cache_settings
        env["SLUICE_CACHE_DISK_DIR"] = str(c.resolved_disk_dir())
        env["SLUICE_CACHE_MEMORY_DIR"] = str(c.resolved_memory_dir())

    def _tenant_cache_dirs(self, env: dict[str, str], user: JobUser) -> None:
        """A job that reads datasets writes into the node cache; under isolation each tenant uid
        gets its own cache folders (0700) inside the node's, so no tenant reads or poisons
        another's cached bytes, sized to its share of the node's (`tenant_job_env`)."""
        try:
            tenant_job_env(env, self.cache_settings, user)
        except OSError as err:  # a tier folder not the plane's: retrying cannot fix it
            raise LaunchError(f"dataset cache: {err}") from None

    def _release_gpus(self, job_id: str, attempt: int) -> None:
        for g, holder in list(self._gpu_holders.items()):
            if holder == (job_id, attempt):
                del self._gpu_holders[g]

    def _take_gpus(self, req: LaunchRequest) -> list[str]:
        want = req.allocation.gpus_per_node().get(self.name, 0)
        if want == 0:
            return []
        free = [g for g in self.gpus if g not in self._gpu_holders]
        if len(free) < want:
            raise LaunchError(f"asked for {want} GPU(s) on {self.name}, {len(free)} free")
        for g in free[:want]:
            self._gpu_holders[g] = (req.job_id, req.attempt)
        return free[:want]

    def _write_state(self, att: _Attempt, limit: float | None, request: float, **extra: Any) -> None:
        att.extra.update(extra)
        write_json_atomic(
            att.dir / STATE_FILE,
            {
                "job_id": att.job_id,
                "attempt": att.attempt,
                "node": self.name,
                "shim_pid": att.shim_pid,
                "shim_create_time": att.shim_create,
                "cgroup": att.ctrl.name,
                "cpu_limit": limit,
                "cpu_request": request,
                **att.extra,
            },
        )

    # ------------------------------------------------------------------ resize / stop
    def resize(self, job_id: str, attempt: int, allocation: Allocation) -> None:
        with self._lock:
            att = self._watched.get((job_id, attempt))
            if att is None:
                raise LookupError(f"attempt {attempt} of {job_id} is not running on {self.name}")
            a = allocation.assignments[0]
            att.ctrl.apply(a.cpu_limit, a.cpu_request)
            self._write_state(att, a.cpu_limit, a.cpu_request)

    def stop(self, job_id: str, attempt: int, checkpoint: bool = True) -> None:
        with self._lock:
            att = self._watched.get((job_id, attempt))
            if att is None or not att.alive():
                return  # already gone: its JobExited comes (or came) from poll()
            now = self.clock()
            if checkpoint and att.stop_signal is None:
                self._signal(att, signal.SIGTERM)
                att.stop_signal, att.stop_deadline = "SIGTERM", now + self.settings.stop_grace_s
            elif not checkpoint:
                self._signal(att, signal.SIGKILL)
                att.stop_signal, att.stop_deadline = "SIGKILL", None
            record: dict[str, Any] = {"signal": att.stop_signal, "time": now, "deadline": att.stop_deadline}
            if att.extra.get("disk_stop"):
                record["disk"] = att.extra["disk_stop"]  # killed for its disk first: that stays its end
            _mark(att.dir / STOP_FILE, record)

    @staticmethod
    def _signal(att: _Attempt, sig: signal.Signals) -> None:
        try:
            os.killpg(att.shim_pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as err:
            log.warning("cannot signal job %s: %s", att.job_id, err)

    # ------------------------------------------------------------------ poll
    def _disk_watched(self) -> list[Watched]:
        """The running attempts, their folders (their own run folder, and their job's, which
        holds a gang's log) and their resources.disk_mb, for the disk watch's thread."""
        with self._lock:
            return [
                self._watched_as(key, att)
                for key, att in self._watched.items()
                # one given SIGTERM is still measured: it may write all through its stop_grace_s
                if att.stop_signal in (None, "SIGTERM") and att.alive()
            ]

    def _watched_as(self, key: tuple[str, int], att: _Attempt) -> Watched:
        return Watched(
            key,
            tuple(dict.fromkeys((self.job_dir(att.job_id), self.job_dir(att.log_job or att.job_id)))),
            att.extra.get("disk_mb") if isinstance(att.extra.get("disk_mb"), int) else None,
            tuple(
                str(d / "cgroup.procs")
                for d in (att.ctrl.cpu_dir, att.ctrl.acct_dir, att.mem.dir if att.mem is not None else None)
                if d is not None
            ),
            att.shim_pid,
        )

    def _stop_for_disk(self, now: float) -> None:
        """Kill the attempts the disk watch found over a bound; the reason goes in the job's
        log and in the stop file, where `_finish` reads it (after an agent restart too)."""
        for key, why in self.disk.take(self._watched).items():
            att = self._watched.get(key)
            if att is None or att.stop_signal not in (None, "SIGTERM") or not att.alive():
                continue
            log.warning("%s: stopping %s attempt %d: %s", self.name, att.job_id, att.attempt, why)
            _mark(att.dir / STOP_FILE, {"signal": "SIGKILL", "time": now, "deadline": None, "disk": why})
            self._note_in_log(att.log_job or att.job_id, f"[sluice] {why}")
            self._signal(att, signal.SIGKILL)
            att.stop_signal, att.stop_deadline = "SIGKILL", None
            att.extra["disk_stop"] = why

    def poll(self) -> list[Event]:
        with self._lock:
            now = self.clock()
            self._walks_wait_until = time.monotonic() + FINAL_WALK_WAIT_S
            self._stop_for_disk(now)
            for adir, _ in self._told:  # the caller has stored what the last poll told
                _mark(adir / REPORTED_FILE, None)
            told, self._retold = self._retold, []
            events, self._pending = self._pending + [e for _, e in told], []
            for key, att in list(self._watched.items()):
                dead = not att.alive()
                events.extend(self._progress(att))
                if dead:
                    if not self._final_walk_done(key, att):
                        continue  # a large folder: its exit is told when the walk is done
                    last = self._usage(att, now, final=True)  # its cgroup's counter, read before cleanup
                    if last is not None:
                        events.append(last)
                    exited = self._finish(att, now)
                    events.append(exited)
                    told.append((att.dir, exited))
                    del self._watched[key]
                    continue
                if att.stop_deadline is not None and now >= att.stop_deadline:
                    self._signal(att, signal.SIGKILL)
                    att.stop_signal, att.stop_deadline = "SIGKILL after grace", None
                    _mark(att.dir / STOP_FILE, {"signal": att.stop_signal, "time": now, "deadline": None})
                if now >= att.next_usage:
                    att.next_usage = now + self.settings.usage_sample_s
                    usage = self._usage(att, now)
                    if usage is not None:
                        events.append(usage)
            if now >= self._next_kpi:
                self._next_kpi = now + self.settings.kpi_sample_s
                if self._kpis is None:
                    self._kpis = KpiSampler(self.cpus, gpus=self.gpus, groups=self.groups, memory_mb=self.memory_mb)
                else:
                    self._kpis.observe(events)
                    values = self._kpis.sample(jobs=len(self._watched))
                    events.append(NodeKPIs(self.name, now, values))
            cache = self._cache.poll(now, events)
            if cache is not None:
                events.append(cache)
            self._told = told
            return events

    def retell(self) -> int:
        """Tell the exits of the last poll again at the next, unmarked: a new plane is polling,
        and the plane the last poll answered may have died before it stored them (on Ray the
        answer to a poll in flight dies with its caller). How many will be told again."""
        with self._lock:
            self._retold, self._told = self._told + self._retold, []
            return len(self._retold)

    def _progress(self, att: _Attempt) -> list[Event]:
        """The job's new progress records as events; records a job may not send are dropped
        (the file is the job's own: `progress_record`)."""
        out: list[Event] = []
        for rec in att.tail.read():
            e = progress_event(att.job_id, att.attempt, rec, self.clock)
            if e is not None:
                out.append(e)
        return thin(out)

    def _usage(self, att: _Attempt, now: float, *, final: bool = False) -> JobUsage | None:
        """The attempt's CPU use: its rate since the last sample, and its total (`cpu_s`). The
        `final` one, as the attempt ends, carries the total even without a rate (0 then), so
        a job's CPU-seconds are counted to its end, not to its last sample."""
        used = att.ctrl.usage_s()
        if used is None:
            return None
        key = (att.job_id, att.attempt)
        size = self.disk.measured(key)
        if final and att.final_walk is not None and att.final_walk.done():
            try:
                size = att.final_walk.result()
            except Exception:
                log.exception("%s: the last walk of %s attempt %d failed", self.name, att.job_id, att.attempt)
        disk_mb = None if size is None else (size.bytes - (0 if _counts_gang_folder(att) else size.shared)) / MIB
        prev, att.last_usage = att.last_usage, (now, used)
        if final and (prev is None or now <= prev[0]):
            return JobUsage(att.job_id, att.attempt, now, 0.0, cpu_s=used, disk_mb=disk_mb)
        if prev is None or now <= prev[0]:
            return None
        memory_mb = 0.0
        if att.child is None:
            pid = self.child_pid(att.job_id, att.attempt)
            if pid is not None:
                with contextlib.suppress(psutil.Error):
                    att.child = psutil.Process(pid)
        if att.child is not None:
            with contextlib.suppress(psutil.Error):
                memory_mb = att.child.memory_info().rss / (1024 * 1024)
        rate = max(0.0, (used - prev[1]) / (now - prev[0]))
        return JobUsage(att.job_id, att.attempt, now, rate, memory_mb, cpu_s=used, disk_mb=disk_mb)

    def _final_walk_done(self, key: tuple[str, int], att: _Attempt) -> bool:
        """Whether the walk of an ended attempt's folders is done, begun at the first ask: what
        it wrote since the disk watch's last check (all of it, for a job shorter than
        disk_check_s) stays in its folder and counts against its tenant's max_disk_mb (red team
        s29: a short job read as never measured). Done in a thread of its own, waited for
        FINAL_WALK_WAIT_S: a folder of a million entries takes seconds, which would hold up
        this poll and, on the local engine, the plane's round."""
        if att.final_walk is None:
            w = self._watched_as(key, att)
            if self._walker is None:
                self._walker = ThreadPoolExecutor(1, thread_name_prefix=f"sluice-last-walk-{self.name}")
            att.final_walk = self._walker.submit(lambda: folder_size(w.folders, pids=job_pids(w.procs_files, w.pid)))
            with contextlib.suppress(TimeoutError):  # the poll's budget for all of them, not each's
                att.final_walk.result(timeout=max(0.0, self._walks_wait_until - time.monotonic()))
        return att.final_walk.done()

    def _finish(self, att: _Attempt, now: float) -> JobExited:
        if att.popen is not None:
            att.popen.wait()
        if att.popen is not None or att.proc is not None or att.child is not None:
            # Leftovers of the job (orphaned data-loader workers) still hold the process group,
            # so its id cannot have been recycled since we saw it alive: safe to kill. An attempt
            # that ended long before we looked is left alone — its pid may be anyone's by now.
            self._signal(att, signal.SIGKILL)
        # What left the process group (setsid) is still in the attempt's cgroups: killed too,
        # before its GPU goes to another job (its fence would still let it open that GPU).
        kill_members(
            (
                att.ctrl.cpu_dir,
                att.ctrl.acct_dir,
                att.mem.dir if att.mem is not None else None,
                att.fence.dir if att.fence is not None else None,
            )
        )
        rec = _read_json(att.dir / EXIT_FILE)
        stop = _read_json(att.dir / STOP_FILE)
        stop_sig = att.stop_signal or (stop or {}).get("signal")
        node_lost = False
        if rec is not None:
            code, reason = int(rec.get("exit_code", -9)), str(rec.get("reason", ""))
            when = float(rec.get("time", now))
            node_lost = rec.get("node_lost") is True
        elif stop_sig is not None and "SIGKILL" in stop_sig:
            code, reason, when = -int(signal.SIGKILL), "killed", now
        else:
            code, reason, when = -int(signal.SIGKILL), "job and its supervisor vanished without an exit record", now
        disk = (stop or {}).get("disk") or att.extra.get("disk_stop")
        if isinstance(disk, str) and disk:
            reason = disk  # the bound it passed, not "stopped by sluice (SIGKILL)"
        elif stop_sig is not None:
            reason = f"stopped by sluice ({stop_sig}): {reason}"
        oom = None if att.mem is None or node_lost else att.mem.oom(code)
        if oom is not None:
            self._note_in_log(att.log_job or att.job_id, f"[sluice] {oom}")
        att.ctrl.cleanup()
        if att.mem is not None:
            att.mem.cleanup()
        if att.fence is not None:
            att.fence.cleanup()
        if self.groups.net is not None:
            self.groups.net.drop_job(att.ctrl.name)
        if "net_fence_uid" in att.extra:
            self.net_fence.remove(att.ctrl.name)
        self._release_gpus(att.job_id, att.attempt)
        retryable = not (isinstance(disk, str) and disk)  # its folder outlives it: a retry meets the same bound
        return JobExited(att.job_id, att.attempt, when, code, reason, node_lost=node_lost, oom=oom, retryable=retryable)

    def _note_in_log(self, job_id: str, line: str) -> None:
        """A line of the plane's in the job's log (the user reads why their job ended there)."""
        try:
            with open(self.log_path(job_id), "a") as f:
                f.write(line + "\n")
        except OSError as err:
            log.debug("could not note %r in the log of %s: %s", line, job_id, err)

    # ------------------------------------------------------------------ adoption
    def _adopt(self) -> None:
        for state_file in sorted(self.runs_dir.glob("*/attempt-*/" + STATE_FILE)):
            adir = state_file.parent
            state = _read_json(state_file)
            if state is None or state.get("node") != self.name or (adir / REPORTED_FILE).exists():
                continue
            job_id, attempt = str(state["job_id"]), int(state["attempt"])
            if not self._plane_attempt_dir(adir, job_id, attempt):
                log.warning("not adopting %s: not an attempt folder the plane made for its state", adir)
                continue
            ctrl = CpuController(
                self.layout, str(state["cgroup"]), self.cpus, node_cpuset=self.cpuset, ledger=self.ledger
            )
            limit_mb = state.get("memory_mb")
            mem = None
            if isinstance(limit_mb, int) and self.layout.memory_kind is not None:
                mem = MemoryController(self.layout, str(state["cgroup"]), limit_mb)
            att = _Attempt(
                job_id,
                attempt,
                adir,
                int(state["shim_pid"]),
                float(state["shim_create_time"]),
                ctrl,
                JsonlTail(adir / PROGRESS_FILE),
                mem,
            )
            kept = ("launched_at", "memory_mb", "disk_mb", "log_job", "fence_dir", "net_fence_uid")
            att.extra = {k: v for k, v in state.items() if k in kept}
            att.fence = self._adopted_fence(state)
            att.log_job = str(state.get("log_job") or job_id)
            att.proc = _same_process(att.shim_pid, att.shim_create)
            if att.proc is None and not (adir / EXIT_FILE).exists():
                child = _read_json(adir / CHILD_FILE)
                if child is not None:
                    att.child = _same_process(int(child["pid"]), float(child.get("started", 0.0)))
            if att.proc is not None:
                ctrl.attach(att.shim_pid)
            stop = _read_json(adir / STOP_FILE)
            if stop is not None:
                att.stop_signal = stop.get("signal")
                att.stop_deadline = stop.get("deadline")
            att.next_usage = self.clock() + self.settings.usage_sample_s
            self._watched[(job_id, attempt)] = att
            log.info(
                "adopted attempt %d of %s (%s)", attempt, job_id, "running" if att.alive() else "ended while unwatched"
            )
        # The network fence's table outlived the last agent: keep the adopted attempts' rules.
        net_group = self.groups.net.group if isinstance(self.groups.net, NodeNetV2) else None
        if net_group is not None:
            self.net_fence.adopt(
                {
                    a.ctrl.name: (net_group / a.ctrl.name, int(a.extra["net_fence_uid"]))
                    for a in self._watched.values()
                    if isinstance(a.extra.get("net_fence_uid"), int)
                }
            )

    def _adopted_fence(self, state: dict[str, Any]) -> DeviceFence:
        """The fence of an attempt made before this agent started, to empty and remove when it
        ends: where its state names a v1 fence group, that one (this agent may have started
        with another gpu_fence setting), else the one this agent would make."""
        name = str(state["cgroup"])
        support = self.fence
        named = state.get("fence_dir")
        if isinstance(named, str):
            d = Path(named)
            if d.name == name and d.is_relative_to(SYSFS_CGROUP / "devices") and ".." not in d.parts:
                support = FenceSupport(FenceKind.V1, d.parent)
        return DeviceFence(support, name, FencePlan((), ()), None)

    def _plane_attempt_dir(self, adir: Path, job_id: str, attempt: int) -> bool:
        """Whether `adir` is the attempt folder the agent made for (job_id, attempt): at that
        very name, a real folder, the plane's own and writable by it alone. A job's folder
        named like one (a checkpoint location the plane refuses today, kept from before) holds
        files the job wrote, which must never point the agent at a process."""
        try:
            if adir != self.attempt_dir(job_id, attempt):
                return False
            plane_owned(adir)
        except (LaunchError, OSError):
            return False
        return True

    def alive(self) -> dict[str, int]:
        with self._lock:
            # one whose last walk is under way has ended, but its exit is not told yet
            return {a.job_id: a.attempt for a in self._watched.values() if a.alive() or a.final_walk is not None}

    def unfinished(self) -> list[str]:
        """The job (replica) ids of the attempts this node has not finished yet: running, or
        ended with their leftovers (processes that left the job's process group) not yet killed
        and their exit not yet told. Their folders are still the node's to write in."""
        with self._lock:
            return sorted({a.job_id for a in self._watched.values()})

    def _warm_jail(self, user: JobUser) -> MemoryController | None:
        """The memory cgroup a warm helper of `user` runs in (settings `warm_memory_mb`, default a
        quarter of RAM), or None where this node has no cgroup memory controller (logged once).
        What the warm writes into the memory tier (tmpfs) is charged to that cgroup too, so it
        also holds the tenant's share of that tier (`tenant_share`), which the cache keeps to."""
        if self.layout.memory_parent is None or self.layout.memory_kind is None:
            if not self._warned_warm_jail:
                self._warned_warm_jail = True
                log.warning("%s: dataset warms run without a memory limit: no cgroup memory controller", self.name)
            return None
        limit = self.settings.warm_memory_mb or psutil.virtual_memory().total // (4 * 1024 * 1024)
        limit += -(-tenant_share(self.cache_settings)[0] // (1024 * 1024))
        name = f"sluice-warm-{user.uid}-{os.getpid()}-{next(self._warm_jails)}"
        return MemoryController(self.layout, name, limit)

    def warm_dataset(
        self,
        name: str,
        source: str,
        storage_options: dict[str, Any] | None = None,
        workers: int = 16,
        generation: str = "",
        run_as: JobUser | None = None,
    ) -> WarmReport:
        """Fetch a whole dataset into this node's cache (`sluice dataset warm`): runs here
        because the cache is a folder on this node. Blocks until done; errors are in the report.
        The agent fetches on a tenant's behalf, so the admin's source policy applies here too
        (checked again at connect time: the name may resolve differently than at `create`).

        `run_as`: the tenant whose jobs will read it, under isolation: their jobs read a cache
        of that uid's own, so that is the one filled, by a helper running as that uid
        (agent/tenant_cache.py). None: the node's shared cache, which jobs read without
        isolation. `generation`: which registration of the dataset, as its jobs open it."""
        guard = guard_from(self.settings)
        if run_as is not None:
            try:
                # The helper runs as the tenant's uid outside any job group, where its jobs may
                # ptrace it, and fetches a URL the tenant chose: its connections are the
                # tenant's too (agent/net_fence.py).
                self.net_fence.mark_tenant(run_as.uid)
            except OSError as err:
                return WarmReport(self.name, 0, 0, 0, 0.0, 0.0, error=str(err))
            s = self._cache.settings
            python = self.settings.job_python
            jail = self._warm_jail(run_as)
            return warm_as(
                s, run_as, self.name, name, source, storage_options, workers, guard, generation, python, jail
            )
        return warm_node(
            self._dataset_cache(), self.name, name, source, storage_options, workers, guard=guard, generation=generation
        )

    def drop_dataset(self, name: str, owner: JobUser | None = None) -> int:
        """Remove every cached copy of a dataset from this node (`sluice dataset rm`): every
        source and generation, in the shared cache and in every tenant's own (as that uid);
        returns how many cached copies were removed. OSError (TenantCacheError) when a tenant's
        cache could not be emptied, after all the others were."""
        return drop_everywhere(self._dataset_cache(), self._cache.settings, name, self.settings.job_python, owner)

    def _dataset_cache(self) -> DatasetCache:
        """The node cache that warm and drop work on: opened on first use, then kept."""
        with self._warm_mu:
            if self._warm_cache is None:
                self._warm_cache = DatasetCache(self._cache.settings)
            return self._warm_cache

    def _claiming(self, name: str) -> contextlib.AbstractContextManager[Callable[[Iterable[Path | None]], None]]:
        if self.owners is None:
            return contextlib.nullcontext(lambda dirs: None)
        return self.owners.claiming(self.settings.cgroup_root or "", name)

    # ------------------------------------------------------------------ faults
    def inject_fault(self, kind: str, seconds: float, workers: int | None = None, memory_mb: int = 512) -> FaultReport:
        """Make this node sick for `seconds` (`sluice node fault`): a CPU hog, memory pressure
        or an I/O storm pinned to this node's cores. ValueError names a bad kind or duration."""
        return self.faults.inject(kind, seconds, workers, memory_mb)

    def stop_faults(self) -> int:
        """Stop every fault injected here; returns how many were running."""
        return self.faults.stop_all()

    def close(self) -> None:
        """Forget the attempts; their processes keep running for the next agent to adopt.
        Injected faults are stopped: they belong to this agent, not to a job."""
        self.faults.stop_all()
        self._cache.close()
        self.disk.remove(self._disk_watched)
        if self._own_disk_watch:
            self.disk.close()
        if self._walker is not None:
            self._walker.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for att in self._watched.values():
                if att.popen is not None and att.popen.poll() is not None:
                    att.popen.wait()
            # The table stays for fenced attempts only: one an unfenced job (no isolation)
            # outlives would be left behind for good when this node does not come back.
            running = any(att.alive() and "net_fence_uid" in att.extra for att in self._watched.values())
            alive = {att.ctrl.name for att in self._watched.values() if att.alive()}
            self._watched.clear()
        self.net_fence.close(jobs_running=running)
        remove_groups(self.groups, self.cpuset, keep=alive)
        if self.owners is not None:
            self.owners.release(self.settings.cgroup_root or "", self.name)
