"""How much disk each running job's run folder holds, and which job to stop for it.

A job writes where its uid may: its run folder (its default working folder and HOME, its log,
the checkpoints kept there) lies on the disk that also holds the control plane's database, so
without a bound one tenant's job could fill the disk and stop every tenant's work with the
plane's own. No kernel quota can be counted on (it needs a mount option), so, as Kubernetes'
kubelet does for ephemeral storage, the node agent measures: every `disk_check_s` a thread
walks each running attempt's folders and the agent then stops

- a job whose folders hold more than its `resources.disk_mb` (it asked for that bound), and
- while the disk's free bytes (or free inodes) are under the node's reserve
  (`disk_reserve_percent`), the job whose folders hold the most among those that grew since
  the check before, one a check (a stopped job's folder outlives it: a neighbour writing
  nothing is not stopped for the disk it left full).

Both end the job Failed and not retried: its folder outlives the attempt, so a retry would
meet the same bound. The walk never follows a link, opens each folder from its parent's
descriptor, counts each inode once (a hard link cannot double a job's size, nor shrink it)
and the unlinked files the job's processes still hold, counts blocks on disk (a sparse file
costs what it holds), and stops at MAX_ENTRIES names or MAX_DEPTH levels (a job making
millions of files to slow the walk is stopped for that instead). It bounds what honest jobs
write by mistake; a hostile job can still fill the disk faster than any walk sees
(`fallocate`), so where tenants are not trusted the runs folder wants a filesystem of its
own (docs/security.md, "Disk").
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

MIB = 1024 * 1024
MAX_ENTRIES = 1_000_000
"""Files and folders one job's run folder may hold before the walk stops and the job is
stopped for it (a walk of this many takes a few seconds)."""
RESERVE_MIN_HOLD = 64 * MIB
"""Under the reserve, a job is stopped only if its folders hold at least this much: a disk
filled by something else is not cured by stopping a job that wrote a log."""
RESERVE_MIN_ENTRIES = 10_000
"""Under the reserve of inodes, a job is stopped only if its folders hold at least this many
files and folders (as RESERVE_MIN_HOLD for bytes)."""


MAX_DEPTH = 256
"""Folders nested deeper than this in a run folder stop the walk, and the job as past
MAX_ENTRIES: the walk holds one descriptor a level, and opens each folder from its parent's
(no path is ever too long to measure, nor followed through a symlink swapped in mid-walk)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FolderSize:
    bytes: int
    entries: int
    complete: bool = True
    """False when the walk stopped at its bound of entries (or of depth)."""
    too_deep: bool = False
    """The walk stopped at MAX_DEPTH."""
    shared: int = 0
    """Of `bytes`, those found under the folders after the first (a gang replica's: its gang's
    folder, which every replica of it measures too), each inode where first reached."""


class _Bound(Exception):
    def __init__(self, too_deep: bool = False) -> None:
        self.too_deep = too_deep


def folder_size(
    folders: Iterable[Path],
    most_entries: int = MAX_ENTRIES,
    most_depth: int = MAX_DEPTH,
    pids: Iterable[int] = (),
) -> FolderSize:
    """Bytes on disk under `folders` (blocks, so sparse files count what they hold), each
    inode once, never through a link; stops after `most_entries` entries or `most_depth`
    levels. Each folder is opened from its parent's descriptor (O_NOFOLLOW), never by a
    path: folders nested past PATH_MAX by relative names hide nothing.

    `pids`: the job's processes; the files they hold open or mapped that no folder names any
    more (unlinked, or made with O_TMPFILE, as `tempfile.TemporaryFile` does) on the folders'
    disks are counted too: their blocks stay taken until the job lets go of them. What only the
    folders after the first hold is also told apart (`shared`)."""
    seen: set[tuple[int, int]] = set()
    devices: set[int] = set()
    total = entries = 0

    def count(st: os.stat_result) -> bool:
        """Counts an entry walked (each, towards the bound: a million hard links of one file
        cost the walk a million entries) and its inode's blocks once; False: a seen inode."""
        nonlocal total, entries
        entries += 1
        if entries > most_entries:
            raise _Bound()
        if (st.st_dev, st.st_ino) in seen:
            return False
        seen.add((st.st_dev, st.st_ino))
        total += st.st_blocks * 512
        return True

    def visit(fd: int) -> list[str]:
        """Counts the folder open at `fd` and its files; the names of its folders (none if seen)."""
        if not count(os.fstat(fd)):
            return []
        subs: list[str] = []
        try:
            with os.scandir(fd) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            subs.append(e.name)
                            if entries + len(subs) > most_entries:
                                raise _Bound()
                            continue
                        count(e.stat(follow_symlinks=False))
                    except OSError:
                        continue
        except OSError:
            pass
        return subs

    stack: list[tuple[int, Iterator[str]]] = []
    first: int | None = None  # bytes counted under the first folder, once past it
    try:
        for k, top in enumerate(folders):
            if k == 1:
                first = total
            try:
                fd = os.open(top, _DIR_FLAGS)
            except OSError:
                with contextlib.suppress(OSError):
                    count(os.lstat(top))  # a file (or a link) where a folder was named: itself only
                continue
            stack.append((fd, iter(())))
            devices.add(os.fstat(fd).st_dev)
            stack[-1] = (fd, iter(visit(fd)))
            while stack:
                here, names = stack[-1]
                name = next(names, None)
                if name is None:
                    os.close(here)
                    stack.pop()
                    continue
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=here)
                except OSError:
                    continue  # gone since listed, or no longer a folder (a link is never followed)
                stack.append((fd, iter(())))
                if len(stack) > most_depth:
                    raise _Bound(too_deep=True)
                stack[-1] = (fd, iter(visit(fd)))
    except _Bound as b:
        shared = total - (total if first is None else first)
        return FolderSize(total, entries, complete=False, too_deep=b.too_deep, shared=shared)
    finally:
        for fd, _ in stack:
            os.close(fd)
    shared = total - (total if first is None else first)
    return FolderSize(total + held_unlinked(pids, devices, seen), entries, shared=shared)


def held_unlinked(pids: Iterable[int], devices: set[int], seen: set[tuple[int, int]] | None = None) -> int:
    """Bytes on disk of the regular files on `devices` that `pids` hold open or mapped and
    no folder names (st_nlink 0), each inode once (`seen`: inodes already counted)."""
    seen = set() if seen is None else seen
    total = 0

    def count(path: str) -> None:
        nonlocal total
        try:
            st = os.stat(path)  # the open file itself, through /proc's link
        except OSError:
            return
        held = st.st_nlink == 0 and stat.S_ISREG(st.st_mode) and st.st_dev in devices
        if held and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512

    if not devices:
        return 0
    for pid in set(pids):
        proc = f"/proc/{pid}"
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"{proc}/fd"):
                # its name first (no filesystem asked): a file on a hung NFS mount is never stat'ed
                with contextlib.suppress(OSError):
                    if os.readlink(f"{proc}/fd/{fd}").endswith(" (deleted)"):
                        count(f"{proc}/fd/{fd}")
        with contextlib.suppress(OSError), open(f"{proc}/maps", "rb") as maps:
            for line in maps:
                if line.rstrip().endswith(b" (deleted)"):
                    count(f"{proc}/map_files/{line.split(b' ', 1)[0].decode()}")
    return total


def job_pids(procs_files: Iterable[str], pid: int | None) -> set[int]:
    """A job's processes: its cgroups' members (the shim joins them before the job starts);
    where it has none, `pid` (its shim) and its descendants (a walk of every process's)."""
    pids: set[int] = set()
    for f in procs_files:
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(p) for p in Path(f).read_text().split())
    if not pids and pid is not None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            pids.update(p.pid for p in (root, *root.children(recursive=True)))
    return pids


@dataclass(frozen=True)
class Watched:
    """One running attempt as the watch sees it: its key, its folders, its bound (None: none)."""

    key: tuple[str, int]
    folders: tuple[Path, ...]
    limit_mb: int | None
    procs_files: tuple[str, ...] = ()
    """Its cgroups' cgroup.procs: its processes, whose unlinked open files count too."""
    pid: int | None = None
    """Its shim's pid (the processes below it count too, where it has no cgroup)."""


def _gib(n: int) -> str:
    return f"{n / (1024 * MIB):.2f} GiB" if n >= 1024 * MIB else f"{n / MIB:.0f} MiB"


def verdicts(
    sizes: dict[tuple[str, int], FolderSize],
    limits: dict[tuple[str, int], int | None],
    free_bytes: int,
    reserve_bytes: int,
    free_inodes: int = 0,
    reserve_inodes: int = 0,
    before: dict[tuple[str, int], FolderSize] | None = None,
) -> dict[tuple[str, int], str]:
    """Which attempts to stop, and why (pure: the watch's decision on its measurements).
    The reserve is of bytes and of inodes: millions of empty files exhaust a disk's inodes
    (the plane's database can then make no file) with its bytes still free.

    `before`: the check before's sizes. Under the reserve only a job whose folders grew since
    (or that it did not measure) is stopped: a stopped job's folder outlives it, so the disk
    stays short after the job filling it is stopped, and each check would otherwise stop the
    next job holding 64 MiB — any tenant's, writing nothing — until none were left."""

    def grew(key: tuple[str, int], of: str) -> bool:
        was = None if before is None else before.get(key)
        return was is None or getattr(sizes[key], of) > getattr(was, of)

    out: dict[tuple[str, int], str] = {}
    for key, size in sizes.items():
        limit = limits.get(key)
        if size.too_deep:
            out[key] = (
                f"disk: its run folder holds folders nested more than {MAX_DEPTH} deep, the most sluice "
                "measures; stopped (keep deep trees outside the run folder)"
            )
        elif not size.complete:
            out[key] = (
                f"disk: its run folder holds more than {MAX_ENTRIES:,} files and folders, the most sluice "
                "measures; stopped (write fewer, larger files, or keep them outside the run folder)"
            )
        elif limit is not None and size.bytes > limit * MIB:
            out[key] = f"disk: its run folder holds {_gib(size.bytes)}, past its resources.disk_mb of {limit} MiB"
    if reserve_bytes > 0 and free_bytes < reserve_bytes:
        rest = [
            (s.bytes, k) for k, s in sizes.items() if k not in out and s.bytes >= RESERVE_MIN_HOLD and grew(k, "bytes")
        ]
        if rest:
            held, key = max(rest)
            out[key] = (
                f"disk: the node's disk had {_gib(free_bytes)} free, under its reserve of {_gib(reserve_bytes)} "
                f"(disk_reserve_percent), and this job's run folder held the most of the jobs there ({_gib(held)})"
            )
    if reserve_inodes > 0 and free_inodes < reserve_inodes:
        many = [
            (s.entries, k)
            for k, s in sizes.items()
            if k not in out and s.entries >= RESERVE_MIN_ENTRIES and grew(k, "entries")
        ]
        if many:
            held_n, key = max(many)
            out[key] = (
                f"disk: the node's disk had {free_inodes:,} inodes free, under its reserve of {reserve_inodes:,} "
                f"(disk_reserve_percent), and this job's run folder held the most files and folders of the jobs "
                f"there ({held_n:,})"
            )
    return out


class DiskWatch:
    """Measures in a thread of its own every `every_s`; each agent takes what was found for
    its own jobs (`take`) in its poll and stops those jobs. `root`: a folder on the disk to
    watch (the runs folder); `reserve_percent` of that disk's size is kept free (0: no
    reserve). Several agents on one disk (virtual nodes) share one watch (`add`): each with
    its own, every one stopped its own biggest job under the reserve in the same check, so
    N nodes stopped N jobs for one filler."""

    def __init__(
        self,
        root: Path,
        watched: Callable[[], list[Watched]] | None,
        every_s: float,
        reserve_percent: float,
    ) -> None:
        self.root = root
        self._providers: list[Callable[[], list[Watched]]] = [] if watched is None else [watched]
        self.every_s = every_s
        self.reserve_percent = reserve_percent
        self.sizes: dict[tuple[str, int], FolderSize] = {}
        """The newest measurement of each running attempt (for reports)."""
        self._found: dict[tuple[str, int], str] = {}
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, watched: Callable[[], list[Watched]]) -> None:
        """Watch another agent's jobs too (its running attempts, as `Watched`)."""
        with self._mu:
            self._providers.append(watched)

    def remove(self, watched: Callable[[], list[Watched]]) -> None:
        """Stop watching an agent's jobs. Compared by equality: an agent's bound method is a new
        object at each access, equal to the one it added."""
        with self._mu:
            self._providers = [p for p in self._providers if p != watched]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sluice-disk-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.check()
            except Exception:
                log.exception("disk watch: a check failed")

    def check(self) -> dict[tuple[str, int], str]:
        """Measure every watched attempt once; what to stop (also kept for `take`)."""
        with self._mu:
            providers = list(self._providers)
        watched = [w for provider in providers for w in provider()]
        sizes = {w.key: folder_size(w.folders, pids=job_pids(w.procs_files, w.pid)) for w in watched}
        limits = {w.key: w.limit_mb for w in watched}
        try:
            vfs = os.statvfs(self.root)
            free, reserve = vfs.f_bavail * vfs.f_frsize, int(vfs.f_blocks * vfs.f_frsize * self.reserve_percent / 100)
            # f_files 0: a filesystem with no fixed count of inodes (btrfs): none to keep
            free_inodes, reserve_inodes = vfs.f_favail, int(vfs.f_files * self.reserve_percent / 100)
        except OSError:
            free, reserve, free_inodes, reserve_inodes = 0, 0, 0, 0
        with self._mu:
            before = self.sizes
        found = verdicts(sizes, limits, free, reserve, free_inodes, reserve_inodes, before)
        with self._mu:
            self.sizes = sizes
            self._found.update(found)
        return found

    def measured(self, key: tuple[str, int]) -> FolderSize | None:
        """The newest measurement of one attempt (job or replica id, attempt), if any."""
        with self._mu:
            return self.sizes.get(key)

    def take(self, keys: Iterable[tuple[str, int]] | None = None) -> dict[tuple[str, int], str]:
        """What the checks since the last call found (each once): of the attempts `keys` (an
        agent's own), or every one (None); the others' stay for their agents."""
        with self._mu:
            if not self._found:  # the usual answer, every poll: no set of keys built for it
                return {}
            if keys is None:
                found, self._found = self._found, {}
            else:
                mine = set(keys)
                found = {k: v for k, v in self._found.items() if k in mine}
                self._found = {k: v for k, v in self._found.items() if k not in mine}
        return found

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
