"""Real kernel CPU limits for job processes, whichever cgroup flavour this machine offers.

At start `detect_cgroups()` looks at what is mounted and writable — cgroup v2 with the `cpu`
controller, cgroup v1 `cpu` (+ `cpuacct` for usage, + `cpuset` for virtual nodes), or neither —
and every job then gets a `CpuController` of the matching kind. Where no cgroup can be written
(unprivileged container, locked-down host) we say so ONCE and fall back to CPU affinity: a limit
of x cores pins the job to ceil(x) cores. That is coarser than a CFS quota but still a real,
kernel-enforced ceiling, so FlowCon's re-allocation keeps meaning something.

Live resize is just writing the files again: the job's processes stay the same.

Memory is detected beside CPU, on its own (a hybrid host may have v2 cpu and v1 memory): a job
that sets `resources.memory_mb` gets a `MemoryController` — a hard ceiling in the kernel
(v2 `memory.max` with `memory.swap.max` 0; v1 `memory.limit_in_bytes` and, where swap is
accounted, `memory.memsw.limit_in_bytes`, so swapping cannot dodge it). Over it the kernel's
OOM killer ends the job inside its cgroup and the agent reports `OOMKilled` with the peak.
Without a memory controller there is no fallback that would mean anything: the plane refuses
such jobs at submit (and an agent refuses to launch one) instead of running them unlimited.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import psutil

from sluice.model import OomKill

log = logging.getLogger(__name__)

SYSFS_CGROUP = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000
"""CFS period: 100 ms is the kernel's default and what Docker/Kubernetes use."""
MIN_QUOTA_US = 1_000
"""The kernel refuses quotas below 1 ms."""


class CgroupKind(StrEnum):
    V2 = "cgroup-v2"
    V1 = "cgroup-v1"
    AFFINITY = "affinity"


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where job cgroups are made. `cpu_parent` is None in affinity mode.

    cpuacct_parent: v1 only, when cpuacct is a separate hierarchy (usage counters).
    cpuset_parent:  v1 cpuset hierarchy parent for virtual nodes, when writable.
    cpuset_v2:      v2 with the cpuset controller delegated below the root: a virtual
                    node's group holds its cores in `cpuset.cpus` (node_cgroup.node_groups),
                    and every job and fault below it inherits them.
    """

    kind: CgroupKind
    cpu_parent: Path | None = None
    cpuacct_parent: Path | None = None
    cpuset_parent: Path | None = None
    cpuset_v2: bool = False
    reason: str = ""
    memory_kind: CgroupKind | None = None
    """V1 or V2 where a writable memory controller was found; None: memory_mb cannot be enforced."""
    memory_parent: Path | None = None
    memory_reason: str = ""
    """Why there is no memory controller (empty when there is one)."""


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def _v2_has(mount: Path, controller: str) -> bool:
    controllers = mount / "cgroup.controllers"
    try:
        return controller in controllers.read_text().split()
    except OSError:
        return False


def _parent_under(mount: Path, root: str) -> Path:
    """`root` is a name relative to each hierarchy ("sluice") or an absolute directory inside
    one; an absolute one under another hierarchy is mapped by its path relative to the mount."""
    p = Path(root)
    if not p.is_absolute():
        return mount / p
    for anchor in p.parents:
        if anchor.parent == mount.parent and anchor != mount:
            return mount / p.relative_to(anchor)
    return p


def _ensure_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return _writable_dir(path)


def _members(d: Path) -> set[int]:
    try:
        return {int(p) for p in (d / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


def kill_members(dirs: Iterable[Path | None], rounds: int = 100, sysfs: Path = SYSFS_CGROUP) -> int:
    """SIGKILL every process still in these cgroups (an ended attempt's own groups) and wait,
    briefly, until they are empty; returns how many processes were signalled.

    A job's processes cannot leave its groups (the files are root's), but they can leave its
    process group (`setsid`), so the killpg of the attempt misses them: a daemon left that way
    kept running, and kept the GPU fence of an attempt whose GPU was handed to someone else.
    Membership is checked through a pidfd, so a pid recycled meanwhile is never signalled.
    Only groups under `sysfs` are read (a fake tree of a test holds no one to kill)."""
    groups = [d for d in dict.fromkeys(dirs) if d is not None and d.is_relative_to(sysfs)]
    signalled = 0
    for _ in range(rounds):
        pids = set().union(*(_members(d) for d in groups)) if groups else set()
        if not pids:
            break
        for d in groups:
            if (d / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (d / "cgroup.kill").write_text("1")  # v2 (5.14+): the kernel kills them all, forks included
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            try:
                if any(pid in _members(d) for d in groups):  # still ours, the pidfd pins it
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    signalled += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        time.sleep(0.02)
    return signalled


def _words(path: Path) -> list[str]:
    """A cgroup file's words; a missing file reads as empty (the kernel creates them on mkdir)."""
    return path.read_text().split() if path.exists() else []


def _enable_v2(mount: Path, parent: Path, controller: str) -> bool:
    """cgroup v2 only delegates a controller to children when every ancestor lists it in
    cgroup.subtree_control."""
    chain = [parent, *[p for p in parent.parents if p == mount or mount in p.parents]]
    for directory in reversed(chain):
        ctl = directory / "cgroup.subtree_control"
        try:
            if controller not in _words(ctl):
                ctl.write_text(f"+{controller}")
        except OSError:
            return False
    return True


def detect_cgroups(sysfs: Path = SYSFS_CGROUP, root: str | None = None, *, cpuset: bool = False) -> CgroupLayout:
    """Decide, once, how job CPU and memory limits are enforced on this machine.

    `sysfs` is where cgroup hierarchies are mounted (tests pass a fake tree); `root` is the
    parent of all job cgroups (settings.cgroup_root, default "sluice").
    """
    root = root or "sluice"
    mem_kind, mem_parent, mem_reason = detect_memory(sysfs, root)
    return replace(
        _detect_cpu(sysfs, root, cpuset), memory_kind=mem_kind, memory_parent=mem_parent, memory_reason=mem_reason
    )


def detect_memory(sysfs: Path, root: str) -> tuple[CgroupKind | None, Path | None, str]:
    """(kind, parent of job memory cgroups, why not): v2 `memory` first, then v1 `memory`.

    Separate from the CPU side because hosts mix them (v2 mounted but empty beside v1)."""
    problems: list[str] = []
    for v2 in (sysfs, sysfs / "unified"):
        if not (v2 / "cgroup.controllers").exists():
            continue
        if not _v2_has(v2, "memory"):
            problems.append(f"{v2} is cgroup v2 without the memory controller")
            continue
        parent = _parent_under(v2, root)
        if _ensure_dir(parent) and _enable_v2(v2, parent, "memory"):
            return CgroupKind.V2, parent, ""
        problems.append(f"cannot create or delegate {parent} for memory")
    v1 = sysfs / "memory"
    if (v1 / "memory.limit_in_bytes").exists():
        parent = _parent_under(v1, root)
        if _ensure_dir(parent):
            return CgroupKind.V1, parent, ""
        problems.append(f"{parent} is not writable")
    if not problems:
        problems.append(f"no cgroup memory controller mounted under {sysfs}")
    return None, None, "; ".join(problems)


def _detect_cpu(sysfs: Path, root: str, cpuset: bool) -> CgroupLayout:
    problems: list[str] = []
    for v2 in (sysfs, sysfs / "unified"):
        if not (v2 / "cgroup.controllers").exists():
            continue
        if not _v2_has(v2, "cpu"):
            problems.append(f"{v2} is cgroup v2 without the cpu controller")
            continue
        parent = _parent_under(v2, root)
        if _ensure_dir(parent) and _enable_v2(v2, parent, "cpu"):
            # Virtual nodes: without a cpuset a job could widen its own CPU affinity past
            # its node's cores (seen on a v2-only host, where only affinity kept it there).
            has_cpuset = cpuset and _v2_has(v2, "cpuset") and _enable_v2(v2, parent, "cpuset")
            return CgroupLayout(CgroupKind.V2, cpu_parent=parent, cpuset_v2=has_cpuset)
        problems.append(f"cannot create or delegate {parent}")
    for name in ("cpu", "cpu,cpuacct"):
        v1 = sysfs / name
        if not (v1 / "cpu.cfs_quota_us").exists():
            continue
        parent = _parent_under(v1, root)
        if not _ensure_dir(parent):
            problems.append(f"{parent} is not writable")
            continue
        acct = None
        if not (parent / "cpuacct.usage").exists():
            acct_mount = sysfs / "cpuacct"
            if (acct_mount / "cpuacct.usage").exists() and _ensure_dir(_parent_under(acct_mount, root)):
                acct = _parent_under(acct_mount, root)
        cs = None
        cs_mount = sysfs / "cpuset"
        if cpuset and (cs_mount / "cpuset.cpus").exists():
            cs_parent = _parent_under(cs_mount, root)
            if _ensure_dir(cs_parent) and _init_cpuset(cs_mount, cs_parent):
                cs = cs_parent
        return CgroupLayout(CgroupKind.V1, cpu_parent=parent, cpuacct_parent=acct, cpuset_parent=cs)
    if not problems:
        problems.append(f"no cgroup cpu controller mounted under {sysfs}")
    return CgroupLayout(CgroupKind.AFFINITY, reason="; ".join(problems))


def _init_cpuset(mount: Path, parent: Path) -> bool:
    """v1 cpusets start empty; a child can only hold tasks once cpus and mems are copied down."""
    chain = [parent, *[p for p in parent.parents if mount in p.parents]]
    try:
        for directory in reversed(chain):
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not _words(directory / f):
                    (directory / f).write_text((directory.parent / f).read_text().strip())
    except OSError:
        return False
    return True


_warned = False


def warn_once(layout: CgroupLayout) -> None:
    """One clear line the operator can act on, not one per job: how CPU limits are enforced
    when they cannot use a cgroup, and always how (or whether) memory limits are."""
    global _warned
    if _warned:
        return
    _warned = True
    if layout.kind is CgroupKind.AFFINITY:
        log.warning(
            "no writable cgroup cpu controller (%s): CPU limits fall back to CPU affinity "
            "(a limit of x cores pins a job to ceil(x) cores)",
            layout.reason,
        )
    log.log(*memory_status(layout))


def memory_status(layout: CgroupLayout) -> tuple[int, str]:
    """(log level, sentence) saying whether resources.memory_mb is enforced here, and how."""
    if layout.memory_kind is None:
        return logging.WARNING, (
            f"no writable cgroup memory controller ({layout.memory_reason}): jobs that set "
            "resources.memory_mb are refused at submit"
        )
    return logging.INFO, (
        f"memory limits: resources.memory_mb is enforced by the {layout.memory_kind} memory controller "
        f"under {layout.memory_parent} (swap included); a job over it is OOM-killed and reported OOMKilled"
    )


def cgroup_name(job_id: str, attempt: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)
    return f"{safe}.{attempt}"


@dataclass(slots=True)
class CoreLedger:
    """Which cores the affinity fallback has pinned jobs to, so pinned jobs spread out."""

    cores: tuple[int, ...]
    pinned: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def pick(self, key: str, n: int) -> tuple[int, ...]:
        load = dict.fromkeys(self.cores, 0)
        for k, cs in self.pinned.items():
            if k != key:
                for c in cs:
                    if c in load:
                        load[c] += 1
        chosen = tuple(sorted(sorted(self.cores, key=lambda c: (load[c], c))[: max(1, min(n, len(self.cores)))]))
        self.pinned[key] = chosen
        return chosen

    def release(self, key: str) -> None:
        self.pinned.pop(key, None)


@dataclass(frozen=True, slots=True)
class JoinSpec:
    """What the shim does to put itself (and so its child) under the limits before exec."""

    procs_files: tuple[str, ...] = ()
    cpus: tuple[int, ...] | None = None

    def to_argv(self) -> list[str]:
        out: list[str] = []
        for f in self.procs_files:
            out += ["--join", f]
        if self.cpus is not None:
            out += ["--cpus", ",".join(map(str, self.cpus))]
        return out


class CpuController:
    """CPU limit, weight and usage of one job attempt.

    Lifecycle: create() → apply() → (shim joins via join_spec()) → attach(pid) →
    apply()/usage_s() while it runs → cleanup() after it exits.
    """

    def __init__(
        self,
        layout: CgroupLayout,
        name: str,
        node_cpus: Sequence[int],
        *,
        node_cpuset: Path | None = None,
        ledger: CoreLedger | None = None,
    ) -> None:
        self.layout = layout
        self.name = name
        self.node_cpus = tuple(node_cpus)
        self.node_cpuset = node_cpuset
        self.ledger = ledger or CoreLedger(self.node_cpus)
        self.pid: int | None = None
        self._pinned: tuple[int, ...] | None = None
        self._proc_cache: dict[int, psutil.Process] = {}

    @property
    def cpu_dir(self) -> Path | None:
        return None if self.layout.cpu_parent is None else self.layout.cpu_parent / self.name

    @property
    def acct_dir(self) -> Path | None:
        return None if self.layout.cpuacct_parent is None else self.layout.cpuacct_parent / self.name

    def create(self) -> None:
        for d in (self.cpu_dir, self.acct_dir):
            if d is not None:
                d.mkdir(exist_ok=True)

    def _virtual(self) -> bool:
        """A virtual node: fewer cores than the machine's."""
        return len(self.node_cpus) < (os.cpu_count() or 1)

    def apply(self, limit_cores: float | None, request_cores: float = 1.0) -> None:
        """Set the hard ceiling (None lifts it) and the share under contention."""
        d = self.cpu_dir
        if self.layout.kind is CgroupKind.V2 and d is not None:
            quota = "max" if limit_cores is None else str(max(MIN_QUOTA_US, round(limit_cores * CFS_PERIOD_US)))
            (d / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")
            (d / "cpu.weight").write_text(str(min(10_000, max(1, round(request_cores * 100)))))
        elif self.layout.kind is CgroupKind.V1 and d is not None:
            (d / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            quota_us = -1 if limit_cores is None else max(MIN_QUOTA_US, round(limit_cores * CFS_PERIOD_US))
            (d / "cpu.cfs_quota_us").write_text(str(quota_us))
            (d / "cpu.shares").write_text(str(max(2, round(request_cores * 1024))))
        else:
            n = len(self.node_cpus) if limit_cores is None else math.ceil(limit_cores - 1e-9)
            self._pinned = self.ledger.pick(self.name, n)
            if self.pid is not None:
                self._set_affinity(self._pinned)

    def join_spec(self) -> JoinSpec:
        files = [str(d / "cgroup.procs") for d in (self.cpu_dir, self.acct_dir) if d is not None]
        if self.node_cpuset is not None:
            files.append(str(self.node_cpuset / "cgroup.procs"))
        cpus = self._pinned if self.layout.kind is CgroupKind.AFFINITY else None
        if cpus is None and self.node_cpuset is None and self.layout.kind is not CgroupKind.AFFINITY:
            # A virtual node without a v1 node cpuset keeps to its cores by affinity (on v2
            # the node group's cpuset.cpus holds it there too; without either a job could
            # widen it).
            cpus = self.node_cpus if self._virtual() else None
        return JoinSpec(tuple(files), cpus)

    def attach(self, pid: int) -> None:
        """The shim's pid (its child and grandchildren are found from it in affinity mode)."""
        self.pid = pid

    def _tree(self) -> list[psutil.Process]:
        if self.pid is None:
            return []
        try:
            root = self._proc_cache.get(self.pid) or psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        self._proc_cache = {p.pid: self._proc_cache.get(p.pid, p) for p in procs}
        return list(self._proc_cache.values())

    def _set_affinity(self, cpus: Sequence[int]) -> None:
        for p in self._tree():
            try:
                p.cpu_affinity(list(cpus))
            except psutil.Error:
                continue

    def usage_s(self) -> float | None:
        """Cumulative CPU seconds used by the attempt's processes (None when unknown).

        From the cgroup's own counter when there is one — one small file read, no process
        scan — else summed over the process tree with psutil.
        """
        d = self.cpu_dir
        try:
            if self.layout.kind is CgroupKind.V2 and d is not None:
                for line in (d / "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec"):
                        return int(line.split()[1]) / 1e6
            acct = self.acct_dir or d
            if self.layout.kind is CgroupKind.V1 and acct is not None and (acct / "cpuacct.usage").exists():
                return int((acct / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None
        total = 0.0
        for p in self._tree():
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                continue
        return total if self.pid is not None else None

    def limits(self) -> dict[str, str]:
        """The kernel's view of this attempt's limits (diagnostics; the tests check a limit took)."""
        d = self.cpu_dir
        if d is None:
            return {"cpus": ",".join(map(str, self._pinned or self.node_cpus))}
        names = ("cpu.max", "cpu.weight") if self.layout.kind is CgroupKind.V2 else ("cpu.cfs_quota_us", "cpu.shares")
        return {n: (d / n).read_text().strip() for n in names}

    def cleanup(self) -> None:
        """Remove the attempt's cgroups (they must be empty: call after the processes exit)."""
        self.ledger.release(self.name)
        for d in (self.cpu_dir, self.acct_dir):
            if d is None:
                continue
            # The kernel drops a dead task from its cgroup a moment after the exit is seen
            # (EBUSY until then): retry briefly rather than leave the cgroup behind.
            for attempt in range(20):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if attempt == 19:
                        log.debug("cgroup %s not removed: %s", d, err)
                    else:
                        time.sleep(0.05)


MIB = 1024 * 1024


def _counter(path: Path, key: str) -> int | None:
    """`key N` from a flat-keyed cgroup file (memory.events, memory.oom_control); None if absent."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class MemoryController:
    """The hard memory ceiling of one job attempt, and whether the OOM killer ended it.

    Lifecycle as CpuController's: create() → apply(limit) → (shim joins procs_files()) →
    oom(exit_code) once the job has exited → cleanup(). Only made for a layout with a memory
    controller (layout.memory_kind set).
    """

    def __init__(self, layout: CgroupLayout, name: str, limit_mb: int) -> None:
        if layout.memory_parent is None or layout.memory_kind is None:
            raise ValueError("resources.memory_mb: no cgroup memory controller on this node")
        self.kind = layout.memory_kind
        self.dir = layout.memory_parent / name
        self.limit_mb = limit_mb

    def create(self) -> None:
        self.dir.mkdir(exist_ok=True)

    def make(self) -> None:
        """create() then apply(); on an OSError nothing is left behind (cleanup) and it is raised."""
        try:
            self.create()
            self.apply()
        except OSError:
            self.cleanup()
            raise

    def apply(self) -> None:
        """Write the ceiling, swap included: memory + swap may not exceed it either."""
        limit = str(self.limit_mb * MIB)
        if self.kind is CgroupKind.V2:
            (self.dir / "memory.max").write_text(limit)
            if (self.dir / "memory.swap.max").exists():
                (self.dir / "memory.swap.max").write_text("0")
            return
        (self.dir / "memory.limit_in_bytes").write_text(limit)  # first: memsw may not be below it
        if (self.dir / "memory.memsw.limit_in_bytes").exists():
            (self.dir / "memory.memsw.limit_in_bytes").write_text(limit)
        elif (self.dir / "memory.swappiness").exists():
            (self.dir / "memory.swappiness").write_text("0")  # no swap accounting: keep it in RAM

    def procs_files(self) -> tuple[str, ...]:
        return (str(self.dir / "cgroup.procs"),)

    def oom_kills(self) -> int | None:
        """How many processes the OOM killer killed in this cgroup; None where the kernel
        keeps no such counter (v1 before Linux 4.13)."""
        if self.kind is CgroupKind.V2:
            return _counter(self.dir / "memory.events", "oom_kill")
        return _counter(self.dir / "memory.oom_control", "oom_kill")

    def peak_bytes(self) -> int | None:
        """The most the attempt's processes held at once (None where the kernel keeps no peak)."""
        if self.kind is CgroupKind.V2:
            return _number(self.dir / "memory.peak")
        peaks = [_number(self.dir / f) for f in ("memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes")]
        known = [p for p in peaks if p is not None]
        return max(known) if known else None

    def oom(self, exit_code: int) -> OomKill | None:
        """The OOM kill that ended the job, if one did: a kill in the cgroup and a failed exit
        (a job that survives the loss of one child and exits 0 was not ended by it)."""
        if exit_code == 0:
            return None
        kills = self.oom_kills()
        if kills is None:  # no counter: a limit hit plus a SIGKILL is the OOM killer's mark
            killed = exit_code == -signal.SIGKILL and (_number(self.dir / "memory.failcnt") or 0) > 0
        else:
            killed = kills > 0
        return OomKill(self.limit_mb, self.peak_bytes()) if killed else None

    def cleanup(self) -> None:
        """Remove the cgroup (shared with the CPU one on v2, where whichever goes second finds
        it gone)."""
        rmdir_group(self.dir)


def rmdir_group(d: Path, tries: int = 20) -> None:
    """Remove an ended attempt's cgroup: the kernel may take a moment to let it go after its
    last process exits, so each rmdir is retried (50 ms apart); one already gone is fine."""
    for attempt in range(tries):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as err:
            if attempt == tries - 1:
                log.debug("cgroup %s not removed: %s", d, err)
            else:
                time.sleep(0.05)


def node_cpuset(layout: CgroupLayout, node: str, cpus: Sequence[int]) -> Path | None:
    """A v1 cpuset cgroup holding one virtual node's cores (None where cpusets are unusable)."""
    if layout.cpuset_parent is None:
        return None
    d = layout.cpuset_parent / node
    try:
        d.mkdir(exist_ok=True)
        (d / "cpuset.mems").write_text((layout.cpuset_parent / "cpuset.mems").read_text().strip())
        (d / "cpuset.cpus").write_text(",".join(map(str, cpus)))
    except OSError as err:
        log.warning("cpuset for %s not usable (%s); its jobs are kept to cores %s by affinity", node, err, cpus)
        return None
    return d


def split_cores(n_nodes: int, cores: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """Split the machine's usable cores into n contiguous slices (round-robin when n > cores)."""
    avail = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if n_nodes <= len(avail):
        k, extra = divmod(len(avail), n_nodes)
        out, i = [], 0
        for node in range(n_nodes):
            size = k + (1 if node < extra else 0)
            out.append(tuple(avail[i : i + size]))
            i += size
        return out
    return [(avail[node % len(avail)],) for node in range(n_nodes)]


def remove_root(root: str, sysfs: Path = SYSFS_CGROUP, wait_s: float = 2.5) -> None:
    """Remove a job-cgroup root (`settings.cgroup_root`) and every group below it, in every
    hierarchy (v1 `cpu/<root>`, `memory/<root>`, ..., the hybrid `unified/<root>`, or v2's
    `<root>`), deepest first.

    For roots a run made for itself (an embedded benchmark plane, a test): once its agents
    have closed, the groups are empty but the kernel may take a moment to let a group go
    after its last process exits, so each rmdir is retried for up to `wait_s`. A group that
    still holds processes is left where it is, and so are the root's network-fence tables;
    once every group is gone, the tables go too.
    """
    if not root or root.startswith("/") or ".." in Path(root).parts:
        raise ValueError(f"cgroup root {root!r}: must be a relative name inside the cgroup mount")
    tops = [top for top in [sysfs / root, *sysfs.glob(f"*/{root}")] if top.is_dir() and top != sysfs]
    for top in tops:
        for d in [*sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), top]:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.05)
    if any(top.is_dir() for top in tops):
        return  # a job still runs in there: its network fence stays with it
    # The network fence keeps a node's nft table while jobs run, for the node's next agent to
    # take over; a root that is gone has no next agent, so its tables go with it.
    from sluice.agent.net_fence import drop_tables_under  # net_fence imports this module

    drop_tables_under(root, sysfs)
