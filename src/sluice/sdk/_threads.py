"""The job's thread pool follows its CPU allocation.

A CPU policy (FlowCon, DQoES) may cut a running job's CFS quota from 2 cores to 1 without
restarting it. A PyTorch job started with 2 intra-op threads keeps them, and two
OpenMP threads spinning at barriers on one core's worth of quota run many times slower
than one thread would (docs/benchmarks.md, "Thread pool after a live CPU cut"). So on
`sdk.report()` — at most every `SLUICE_THREADS_CHECK_S` seconds (default 5), a few small
file reads — the SDK looks at what this process can observe of its own CPU budget:

- its cgroup CPU quota: cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, or v2
  `cpu.max`, in the cgroup named by /proc/self/cgroup (found through /proc/self/mountinfo)
  and every ancestor up to the mount (the tightest one rules);
- its CPU affinity (`sched_getaffinity`): the cores it may run on at all (a virtual node's
  cpuset, or the affinity fallback of a host without a writable cgroup);

and, when the budget rounded to whole cores changes, calls `torch.set_num_threads(n)`
(only if the job has imported torch: the SDK never imports it) in the thread that reports
(torch's intra-op count is per thread: each thread that calls `report()` has its own pool
resized), and once every hook registered with `on_cpu_threads(fn)` (for other frameworks:
`fn(n)`).

The SDK reads only this process's own cgroup, never a neighbour's weight, so under
kernel *weights* (kube, sluice: no quota) the budget is the cores it may run on: idle cores
are its to use.

Opt out (a job that manages its own threads): `SLUICE_THREADS=manual` in the job's env,
or `sdk.manage_threads(False)` before the first report.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PROC_SELF = Path("/proc/self")
DEFAULT_CHECK_S = 5.0


@dataclass(frozen=True, slots=True)
class CpuBudget:
    """What this process may use: `quota_cores` (None = no quota found), `affinity` (cores it
    may run on), the thread count that follows from them, and where the quota came from (or
    why none could be read)."""

    quota_cores: float | None
    affinity: int
    source: str

    @property
    def threads(self) -> int:
        """Whole cores, at least one: a quota is rounded half up (1.5 cores → 2 threads, 1.4 → 1),
        never above the cores the process may run on."""
        n = self.affinity
        if self.quota_cores is not None:
            n = min(n, math.floor(self.quota_cores + 0.5))
        return max(1, n)


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts(proc: Path) -> list[tuple[str, Path, str, set[str]]]:
    """(root inside the hierarchy, mount point, fstype, super options) of each cgroup mount."""
    out = []
    for line in (proc / "mountinfo").read_text().splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((_unescape(fields[3]), Path(_unescape(fields[4])), tail[0], set(tail[2].split(","))))
    return out


def _inside(mount: Path, root: str, path: str) -> Path:
    """The directory of cgroup `path` (as /proc/self/cgroup names it) under a mount of `root`."""
    rel = path[len(root) :] if root != "/" and (path == root or path.startswith(root + "/")) else path
    return mount / rel.lstrip("/")


def find_cpu_cgroup(proc: Path = PROC_SELF) -> tuple[str, Path, Path] | str:
    """("v1" or "v2", this process's cpu cgroup directory, its mount point), or why not."""
    try:
        lines = (proc / "cgroup").read_text().splitlines()
        mounts = _mounts(proc)
    except OSError as err:
        return f"cannot read {proc}/cgroup or mountinfo ({err.strerror})"
    v1_path = v2_path = None
    for line in lines:
        _hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if controllers == "" and _hid == "0":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_path = path
    if v1_path is not None:
        for root, mount, fstype, opts in mounts:
            if fstype == "cgroup" and "cpu" in opts:
                return "v1", _inside(mount, root, v1_path), mount
        return "cgroup v1 cpu controller listed in /proc/self/cgroup but not mounted here"
    if v2_path is not None:
        for root, mount, fstype, _opts in mounts:
            if fstype == "cgroup2":
                return "v2", _inside(mount, root, v2_path), mount
        return "cgroup v2 listed in /proc/self/cgroup but not mounted here"
    return "no cpu cgroup in /proc/self/cgroup"


def _quota_v1(d: Path) -> float | None:
    q = int((d / "cpu.cfs_quota_us").read_text())
    p = int((d / "cpu.cfs_period_us").read_text())
    return None if q < 0 or p <= 0 else q / p


def _quota_v2(d: Path) -> float | None:
    quota, _, period = (d / "cpu.max").read_text().strip().partition(" ")
    return None if quota == "max" or not period else int(quota) / int(period)


def read_quota(kind: str, leaf: Path, mount: Path) -> float | None:
    """The tightest CPU quota on the way from `leaf` up to the mount, in cores (None: none)."""
    read = _quota_v1 if kind == "v1" else _quota_v2
    best: float | None = None
    d = leaf
    while True:
        try:
            q = read(d)
        except (OSError, ValueError):
            q = None  # the root cgroup has no quota file; an unreadable one limits nothing we know
        if q is not None:
            best = q if best is None else min(best, q)
        if d == mount or mount not in d.parents:
            return best
        d = d.parent


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _ThreadState(threading.local):
    """What one thread's pool was given: torch's intra-op count is per thread (OpenMP's
    `omp_set_num_threads` sets the calling thread's), so a `set_num_threads` made while a
    side thread reported did not resize the training thread's pool."""

    def __init__(self) -> None:
        self.next = 0.0
        self.ceiling: int | None = None
        """This thread's own thread count, read at its first check: never exceeded."""
        self.applied: int | None = None


class ThreadSync:
    """Per-process state: where the cgroup is (found once) and the hooks to call when the
    budget changes; per thread (`_ThreadState`): when it last checked, and the count its torch
    pool was given."""

    def __init__(self, proc: Path = PROC_SELF) -> None:
        self.proc = proc
        self.override: bool | None = None
        self.hooks: list[Callable[[int], None]] = []
        self.hooks_applied: int | None = None
        self.hooks_ceiling: int | None = None
        """The hooks' ceiling: torch's count in the first thread that checked (the job's own)."""
        self._thread = _ThreadState()
        self._found: tuple[str, Path, Path] | str | None = None
        self._pid = os.getpid()

    @property
    def enabled(self) -> bool:
        """`manage_threads()` if called, else the job's SLUICE_THREADS (read on each check)."""
        if self.override is not None:
            return self.override
        return os.environ.get("SLUICE_THREADS", "auto").strip().lower() not in ("manual", "off", "0", "false")

    def budget(self) -> CpuBudget:
        if self._found is None or self._pid != os.getpid():
            self._found, self._pid = find_cpu_cgroup(self.proc), os.getpid()
        if isinstance(self._found, str):
            return CpuBudget(None, _affinity(), self._found)
        kind, leaf, mount = self._found
        return CpuBudget(read_quota(kind, leaf, mount), _affinity(), f"cgroup {kind} {leaf}")

    def maybe_sync(self, now: float | None = None) -> int | None:
        """Apply the budget if this thread's check interval has passed; the thread count
        applied, if any."""
        if not self.enabled:
            return None
        now = time.monotonic() if now is None else now
        mine = self._thread
        if now < mine.next:
            return None
        mine.next = now + _check_interval()
        return self.sync()

    def sync(self) -> int | None:
        """Read the budget now and resize the calling thread's torch pool and the hooks if it
        changed; returns the count applied.

        The pool is never made larger than the job made it itself (torch's count at the thread's
        first check is its ceiling): the SDK shrinks a pool to a CPU cut and gives the threads back
        when the cut is lifted, but it does not override a job that chose fewer threads — six
        one-thread jobs sharing two cores must not become six two-thread jobs."""
        mine = self._thread
        torch = sys.modules.get("torch")
        if mine.ceiling is None and torch is not None and hasattr(torch, "get_num_threads"):
            mine.ceiling = max(1, int(torch.get_num_threads()))
        if self.hooks_ceiling is None:
            self.hooks_ceiling = mine.ceiling
        budget = self.budget().threads
        n = budget if mine.ceiling is None else min(budget, mine.ceiling)
        applied = None
        if n != mine.applied:
            if torch is not None and hasattr(torch, "set_num_threads"):
                torch.set_num_threads(n)
            mine.applied = applied = n
        # The hooks set one count for the process: capped by the first checking thread's pool,
        # not by each thread's own (threads with different pools made them flip at every check).
        for_hooks = budget if self.hooks_ceiling is None else min(budget, self.hooks_ceiling)
        if for_hooks != self.hooks_applied:
            for fn in self.hooks:
                fn(for_hooks)
            self.hooks_applied = for_hooks
            applied = n
        return applied


def _check_interval() -> float:
    raw = os.environ.get("SLUICE_THREADS_CHECK_S", "")
    try:
        return max(0.0, float(raw)) if raw.strip() else DEFAULT_CHECK_S
    except ValueError:
        return DEFAULT_CHECK_S


_sync = ThreadSync()


def cpu_budget() -> CpuBudget:
    """This process's CPU budget as it can observe it now (quota, affinity, source)."""
    return _sync.budget()


def on_cpu_threads(fn: Callable[[int], None]) -> None:
    """Call `fn(n)` whenever the job's thread budget changes (and at the next check): for
    frameworks other than torch (e.g. `threadpoolctl`, TensorFlow's intra-op setting)."""
    _sync.hooks.append(fn)
    _sync.hooks_applied = None  # the new hook hears the current budget at the next check


def manage_threads(enabled: bool = True) -> None:
    """Turn the automatic resizing on or off for this process (off: the job manages threads)."""
    _sync.override = enabled


def maybe_sync_threads() -> int | None:
    """Called by `report()`: cheap unless the check interval has passed."""
    return _sync.maybe_sync()
