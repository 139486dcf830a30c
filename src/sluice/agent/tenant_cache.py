"""Each tenant's own dataset cache on a node, under tenant isolation.

A job that runs as a tenant's uid reads and fills cache folders of that uid
(`<disk tier>/uid-<uid>/`, `<memory tier>/uid-<uid>/`: 0700, owned by the uid, inside the
node's plane-owned cache folders), so that one tenant never reads bytes another tenant's job
cached (docs/security.md). `sluice dataset warm` must therefore fill *those* folders — the
node's shared cache is one no isolated job reads — `sluice dataset rm` must empty them too,
and `sluice dataset list` must report from them.

The plane (root) never opens a file in a folder a job can change (the file rule of
`sluice.agent.isolation`), so everything done inside a tenant's folders runs in a short helper
process started as the tenant's uid (`python -m sluice.data.cache_ops`, with the job's umask
077): it can do nothing that tenant's own jobs could not. The plane itself only makes the
folders (exactly as a launch does) and lists the *names* in them, to skip a helper where the
dataset was never cached.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import selectors
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sluice.agent.cgroup import MemoryController, kill_members
from sluice.agent.isolation import PLANE_DIR_MODE, PRIVATE_DIR_MODE, own_dir, plane_dirs, plane_owned, unreachable
from sluice.data.cache import TENANT_DIR, DatasetCache, default_memory_bytes, folder_pattern, reader_key
from sluice.data.guard import SourceGuard
from sluice.data.settings import CacheSettings
from sluice.data.warm import WarmReport
from sluice.model import JobUser

log = logging.getLogger("sluice.agent")

_ENTER = Path(__file__).with_name("enter.py")
"""The launcher that starts a warm's helper inside its memory jail (sluice.agent.enter), by
path: it must not depend on how sluice is installed."""

HELPER_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH")
"""What the helper inherits of the plane's environment (no token, no database URL), plus the
cache's knobs (SLUICE_CACHE_*), as a job does (agent/launchenv.py)."""
LIST_TIMEOUT_S = 300.0
"""How long `dataset create`'s listing of a local source as the tenant's uid may take (s)."""
REPORT_TIMEOUT_S = 30.0
DROP_TIMEOUT_S = 600.0
MAX_ANSWER_BYTES = 1 << 20
"""Most the plane reads of a helper's stdout (and of its stderr): the helper is a process of
the tenant's uid, which the tenant's own jobs may tamper with; an answer is a few hundred
bytes (a report of thousands of datasets stays far under this). More is refused, the helper
killed."""


MAX_REPORTED = 4096
"""Most cached copies one tenant's report may name (each becomes a key in the node's report)."""
_FOLDER = re.compile(r"[A-Za-z0-9._~-]{1,200}-[0-9a-f]{10}")
"""What a cache folder (`dataset_id`) looks like; anything else in a tenant's answer is dropped."""
REPORT_MAX_AGE_S = 300.0
"""A tenant's cache is read again at least this often even when nothing seems to change."""


class TenantCacheError(OSError):
    """A helper run as a tenant's uid could not do its work; the message says why."""


def tenant_dir(base: str | os.PathLike[str], user: JobUser) -> Path:
    """The tenant's cache folder in the tier at `base`, made if missing: the folders up to
    `base` are the plane's (0711), `uid-<uid>` is the tenant's (0700). What a launch gives the
    job as SLUICE_CACHE_DISK_DIR / SLUICE_CACHE_MEMORY_DIR, and what warm fills."""
    root = plane_owned(plane_dirs(Path(base)))  # the tier's folder: never one a job made first
    return own_dir(root / f"uid-{user.uid}", PRIVATE_DIR_MODE, user)


def tenant_dirs(settings: CacheSettings, user: JobUser) -> tuple[Path, Path]:
    """(disk tier and index, memory tier) of the tenant's cache on this node, made if missing."""
    return tenant_dir(settings.resolved_disk_dir(), user), tenant_dir(settings.resolved_memory_dir(), user)


def tenants_here(settings: CacheSettings) -> dict[JobUser, tuple[Path, Path]]:
    """Every tenant uid with a cache folder on this node (in either tier), and its two folders.
    Only a real folder owned by the uid its name says counts: anything else in the plane's
    cache folder was not made by sluice and is left alone."""
    found: dict[JobUser, tuple[Path, Path]] = {}
    bases = (settings.resolved_disk_dir(), settings.resolved_memory_dir())
    for base in bases:
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            if not TENANT_DIR.fullmatch(e.name):
                continue
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == int(e.name.removeprefix("uid-")):
                user = JobUser(st.st_uid, st.st_gid)
                found[user] = (Path(bases[0]) / e.name, Path(bases[1]) / e.name)
    return found


def tenant_job_env(env: dict[str, str], settings: CacheSettings, user: JobUser) -> None:
    """Point a job of `user` that reads datasets (its env names the node's cache folders) at its
    uid's own folders, made if missing, and size its cache to its share of the node's
    (`tenant_share`): what a launch under isolation does (`NodeAgent._tenant_cache_dirs`).
    OSError when a tier folder is not the plane's."""
    made = False
    for var in ("SLUICE_CACHE_DISK_DIR", "SLUICE_CACHE_MEMORY_DIR"):
        base = env.get(var)
        if base:
            env[var] = str(tenant_dir(base, user))
            made = True
    if made:
        memory, disk = tenant_share(settings)
        env["SLUICE_CACHE_MEMORY_BYTES"], env["SLUICE_CACHE_DISK_BYTES"] = str(memory), str(disk)


def tenant_share(settings: CacheSettings) -> tuple[int, int]:
    """(memory, disk) bytes each tenant's own cache on this node may hold: the node's tier
    capacities (SLUICE_CACHE_MEMORY_BYTES, else a quarter of RAM; SLUICE_CACHE_DISK_BYTES)
    split evenly among the tenants that have a cache here. Without it every tenant's cache
    was sized as if it were the node's only one, so N tenants could fill N quarters of RAM
    in /dev/shm. A launch gives the job its share (SLUICE_CACHE_*_BYTES), a warm fills within
    it, and the cache report shrinks a tenant's cache that holds more once another arrives."""
    n = max(1, len(tenants_here(settings)))
    memory = settings.memory_bytes if settings.memory_bytes is not None else default_memory_bytes()
    return memory // n, settings.disk_bytes // n


def holds(folders: tuple[Path, Path], name: str) -> bool:
    """Whether a tenant's cache folders have a folder of dataset `name` (any source or
    generation). Reads names only, never a file of the tenant's."""
    pattern = folder_pattern(name)
    for folder in folders:
        try:
            with os.scandir(folder) as entries:
                if any(pattern.fullmatch(e.name) for e in entries):
                    return True
        except (FileNotFoundError, NotADirectoryError):
            continue
    return False


def run_helper(
    user: JobUser,
    request: dict[str, Any],
    timeout: float | None,
    python: str | None = None,
    jail: MemoryController | None = None,
) -> dict[str, Any]:
    """Run one `sluice.data.cache_ops` request in a process of `user`'s uid (this process's own
    identity when it is that user already); its answer, or TenantCacheError saying why not.
    `python`: the interpreter tenants' jobs run (settings job_python; default this one): it
    must be one the uid may run, with sluice importable, as for a job. `jail`: a memory cgroup
    the helper runs in from its first instruction (made first; a launcher joins it, then
    becomes the tenant's uid and the helper): a warm holds items in memory, and a tenant
    chooses how big they are."""
    python = python or sys.executable
    me = (os.geteuid(), os.getegid())
    switch: dict[str, Any] = {}
    if (user.uid, user.gid) != me:
        problem = unreachable(python, user, os.X_OK)
        if problem is not None:
            raise TenantCacheError(f"cannot run the cache helper as {user}: {problem}")
        switch = {"user": user.uid, "group": user.gid, "extra_groups": [], "umask": 0o077}
    env = {k: v for k, v in os.environ.items() if k in HELPER_ENV or k.startswith("SLUICE_CACHE_")}
    env.pop("SLUICE_CACHE_DISK_DIR", None)
    env.pop("SLUICE_CACHE_MEMORY_DIR", None)
    env["HOME"] = "/"
    argv = [python, "-m", "sluice.data.cache_ops"]
    if jail is not None:
        # Made first, and the helper started in it by a launcher that joins it while it is
        # still the plane's, then drops to the tenant's uid (sluice.agent.enter): moved in
        # after it started, the helper was the tenant's for a moment outside it.
        try:
            jail.make()
        except OSError as err:
            raise TenantCacheError(f"could not hold the cache helper as {user} to its memory limit: {err}") from None
        as_user = ["--user", f"{switch['user']}:{switch['group']}"] if switch else []
        argv = [sys.executable, str(_ENTER), "--strict", *as_user, *jail.procs_files(), "--", *argv]
        switch = {}
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd="/",
            close_fds=True,
            **switch,
        )
    except (OSError, subprocess.SubprocessError) as err:
        if jail is not None:
            jail.cleanup()
        raise TenantCacheError(f"could not start the cache helper as {user}: {err}") from None
    try:
        out, err_text, why = _bounded(proc, json.dumps(request).encode(), timeout)
        oom = jail.oom(proc.returncode if proc.returncode is not None else -9) if jail is not None else None
    finally:
        if jail is not None:
            # What the helper left in its jail (a child it forked, as a job of the same uid that
            # traces it could make it) is killed with it: `_bounded` kills the helper's pid only,
            # and a group with a process in it cannot be removed, so both stayed behind.
            kill_members((jail.dir,))
            jail.cleanup()
    if oom is not None:
        raise TenantCacheError(
            f"the cache helper ({request.get('op')}) as {user} went past its memory limit of {oom.limit_mb} MiB "
            "and was killed: it holds up to `workers` items at once, whole (settings warm_memory_mb)"
        )
    if why == "timeout":
        setting = " (setting SLUICE_CACHE_WARM_TIMEOUT_S)" if request.get("op") == "warm" else ""
        raise TenantCacheError(f"the cache helper ({request.get('op')}) as {user} took over {timeout:g} s{setting}")
    if why == "too much":
        raise TenantCacheError(f"the cache helper as {user} wrote more than {MAX_ANSWER_BYTES} bytes; killed")
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err_text)
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        tail = " | ".join(done.stderr.decode(errors="replace").strip().splitlines()[-3:]) or "no answer"
        raise TenantCacheError(f"the cache helper as {user} exited {done.returncode}: {tail}")
    if "failed" in answer:
        raise TenantCacheError(f"in the cache of {user}: {answer['failed']}")
    return answer


def _bounded(proc: subprocess.Popen[bytes], request: bytes, timeout: float | None) -> tuple[bytes, bytes, str]:
    """Send the request, then read stdout and stderr, each up to MAX_ANSWER_BYTES, until the
    helper exits: (stdout, stderr, "" | "timeout" | "too much"). Over either bound the helper
    is killed, never left running."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    got: dict[int, bytearray] = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(request)
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    deadline = None if timeout is None else time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                proc.kill()
                proc.wait()
                return bytes(got[proc.stdout.fileno()]), bytes(got[proc.stderr.fileno()]), "timeout"
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                got[key.fd] += chunk
                if len(got[key.fd]) > MAX_ANSWER_BYTES:
                    proc.kill()
                    proc.wait()
                    return bytes(got[proc.stdout.fileno()]), bytes(got[proc.stderr.fileno()]), "too much"
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        proc.wait(left)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return bytes(got[proc.stdout.fileno()]), bytes(got[proc.stderr.fileno()]), "timeout"
    return bytes(got[proc.stdout.fileno()]), bytes(got[proc.stderr.fileno()]), ""


def warm_as(
    settings: CacheSettings,
    user: JobUser,
    node: str,
    name: str,
    source: str,
    storage_options: Mapping[str, Any] | None = None,
    workers: int = 16,
    guard: SourceGuard | None = None,
    generation: str = "",
    python: str | None = None,
    jail: MemoryController | None = None,
) -> WarmReport:
    """Warm the dataset into `user`'s own cache on this node: the folders that tenant's jobs
    read. Errors are in the report, as `sluice.data.warm.warm_node` has them. `jail`: the
    memory cgroup the helper runs in (`run_helper`)."""
    g = guard or SourceGuard()
    started = time.monotonic()
    try:
        disk, memory = tenant_dirs(settings, user)
        memory_bytes, disk_bytes = tenant_share(settings)
        answer = run_helper(
            user,
            {
                "op": "warm",
                "disk_dir": str(disk),
                "memory_dir": str(memory),
                "memory_bytes": memory_bytes,
                "disk_bytes": disk_bytes,
                "node": node,
                "name": name,
                "source": source,
                "storage_options": dict(storage_options or {}),
                "generation": generation,
                "workers": workers,
                "guard": {"roots": list(g.roots), "allow_hosts": list(g.allow_hosts)},
            },
            settings.warm_timeout_s,  # a source that answers slowly or never holds source slots
            python,
            jail,
        )
        # Taken field by field: the answer comes from a process of the tenant's uid.
        error = answer.get("error")
        return WarmReport(
            node=node,
            files_fetched=int(answer["files_fetched"]),
            bytes_fetched=int(answer["bytes_fetched"]),
            already_cached=int(answer["already_cached"]),
            seconds=float(answer["seconds"]),
            cached_fraction=min(1.0, max(0.0, float(answer["cached_fraction"]))),
            error=None if error is None else str(error),
        )
    except (OSError, KeyError, TypeError, ValueError) as err:  # how long it ran: "failed after 0.0 s" was none
        return WarmReport(node, 0, 0, 0, round(time.monotonic() - started, 3), 0.0, f"{type(err).__name__}: {err}")


def list_as(
    user: JobUser,
    source: str,
    storage_options: Mapping[str, Any] | None = None,
    guard: SourceGuard | None = None,
    python: str | None = None,
) -> tuple[int, int]:
    """(items, total bytes) of `source`, listed by a helper of `user`'s uid: what that tenant's
    own permissions let it see. TenantCacheError with the helper's reason (the source's
    SourceError, a permission error) when it cannot."""
    g = guard or SourceGuard()
    request = {
        "op": "list",
        "source": source,
        "storage_options": dict(storage_options or {}),
        "guard": {"roots": list(g.roots), "allow_hosts": list(g.allow_hosts)},
    }
    try:
        answer = run_helper(user, request, LIST_TIMEOUT_S, python)
    except TenantCacheError as err:
        why = str(err).replace(f"in the cache of {user}: ", "", 1)
        raise TenantCacheError(f"listed as {user}, with the tenant's own file permissions: {why}") from None
    try:  # the answer comes from a process of the tenant's uid
        items, total = int(answer["items"]), int(answer["total_bytes"])
    except (KeyError, TypeError, ValueError):
        raise TenantCacheError(f"the cache helper as {user} gave no listing") from None
    return max(0, items), max(0, total)


class BackgroundDrops:
    """Other tenants' copies of a dataset being removed off the request that asked for it: one
    thread per tenant uid, running that uid's drop helpers one after another. A tenant whose
    cache stalls its helpers (an index it keeps locked, a helper its jobs stop) delays only the
    removal of copies in its own cache."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queues: dict[int, dict[tuple[str, str], tuple[JobUser, dict[str, Any], str | None]]] = {}
        self._workers: dict[int, threading.Thread] = {}

    def add(self, user: JobUser, request: dict[str, Any], python: str | None) -> None:
        with self._cv:
            self._queues.setdefault(user.uid, {}).setdefault(
                (str(request["disk_dir"]), str(request["name"])), (user, request, python)
            )
            if user.uid not in self._workers:
                worker = threading.Thread(target=self._run, args=(user.uid,), name="tenant-cache-drop", daemon=True)
                self._workers[user.uid] = worker
                worker.start()

    def _run(self, uid: int) -> None:
        while True:
            with self._cv:
                queue = self._queues.get(uid)
                if not queue:
                    self._queues.pop(uid, None)
                    self._workers.pop(uid, None)
                    self._cv.notify_all()
                    return
                user, request, python = queue.pop(next(iter(queue)))
            try:
                run_helper(user, request, DROP_TIMEOUT_S, python)
            except OSError as err:
                log.warning("cannot remove %s from the cache of %s: %s", request["name"], user, err)

    def wait(self, timeout: float | None = None) -> bool:
        """Whether every drop asked for has been done (waiting up to `timeout`)."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._workers, timeout)


background_drops = BackgroundDrops()


def drop_everywhere(
    cache: DatasetCache,
    settings: CacheSettings,
    name: str,
    python: str | None = None,
    owner: JobUser | None = None,
) -> int:
    """Remove every cached copy of dataset `name` from this node: the shared cache (`cache`)
    and every tenant's own (each through a helper of that tenant's uid: a published dataset may
    be cached by every tenant that read it). Returns how many copies went; TenantCacheError
    after trying them all, naming each tenant cache it could not empty.

    `owner`: the dataset's owner's uid (isolation). Then only the shared cache and the owner's
    are emptied before this returns (and counted, and their failures raised); other tenants'
    caches are emptied in the background (`background_drops`): which tenants hold a copy is
    read from names they made, and each helper works in a cache its tenant's jobs control, so
    waiting on them let any tenant hold up, and put its words into, another's `rm`. Their
    copies are only room: a re-created dataset is another generation and never reads them."""
    removed = cache.remove(name)
    problems: list[str] = []
    for user, folders in sorted(tenants_here(settings).items(), key=lambda kv: kv[0].uid):
        if not holds(folders, name):
            continue
        request = {"op": "drop", "disk_dir": str(folders[0]), "memory_dir": str(folders[1]), "name": name}
        if owner is not None and user.uid != owner.uid:
            background_drops.add(user, request, python)
            continue
        try:
            removed += int(run_helper(user, request, DROP_TIMEOUT_S, python)["removed"])
        except (OSError, KeyError, ValueError) as err:
            problems.append(str(err))
    if problems:
        raise TenantCacheError(f"removed {removed} cached copies; not from: {'; '.join(problems)}")
    return removed


def fractions_of(
    settings: CacheSettings, user: JobUser, python: str | None = None, share: tuple[int, int] | None = None
) -> dict[str, float]:
    """Cache folder (`dataset_id`) -> share of it in `user`'s own cache on this node: what
    that tenant's jobs will find. Empty when the tenant never cached anything here (no helper
    is started then, and nothing is made). With `share` ((memory, disk) bytes: `tenant_share`),
    a tier of that cache sized above it is shrunk to it first (its least valuable items go)."""
    disk = Path(settings.resolved_disk_dir()) / f"uid-{user.uid}"
    try:
        st = os.lstat(disk)
    except FileNotFoundError:
        return {}
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != user.uid:
        return {}
    memory = Path(settings.resolved_memory_dir()) / f"uid-{user.uid}"
    request: dict[str, Any] = {"op": "fractions", "disk_dir": str(disk), "memory_dir": str(memory)}
    if share is not None:
        request["memory_bytes"], request["disk_bytes"] = share
    answer = run_helper(user, request, REPORT_TIMEOUT_S, python)
    fractions = answer.get("fractions")
    try:
        return (
            {str(k): min(1.0, max(0.0, float(v))) for k, v in fractions.items()} if isinstance(fractions, dict) else {}
        )
    except (TypeError, ValueError) as err:
        raise TenantCacheError(f"the cache helper as {user} answered nonsense: {err}") from None


def _fingerprint(folders: tuple[Path, Path]) -> tuple[tuple[int, int], ...]:
    """What changes when a tenant's cache fills or empties, read with lstat only (never
    following a link, never opening a file of the tenant's): its folders and its index."""
    out: list[tuple[int, int]] = []
    disk = folders[0]
    for path in (disk, folders[1], disk / "index.sqlite", disk / "index.sqlite-wal"):
        try:
            st = os.lstat(path)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((0, -1))
    return tuple(out)


class SharedFractions:
    """`fractions_of` for the API's listings (`dataset list`/`get`, CACHED HERE), at most one
    helper per tenant uid at a time and only when its cache changed (`_fingerprint`: lstat
    only). Each listing started a helper process of its own (~0.7 s), so one tenant's parallel
    `GET /v1/datasets` ran dozens at once on the plane's host: another tenant's requests took
    10 s. Now a listing while the tenant's helper is running gets the last answer (empty
    before the first) instead of starting another or waiting for it."""

    def __init__(self, settings: CacheSettings, python: str | None = None) -> None:
        self.settings = settings
        self.python = python
        self._memo: dict[int, tuple[tuple[tuple[int, int], ...], dict[str, float]]] = {}
        self._busy: set[int] = set()
        self._mu = threading.Lock()

    def _mark(self, user: JobUser) -> tuple[tuple[int, int], ...]:
        disk, memory = Path(self.settings.resolved_disk_dir()), Path(self.settings.resolved_memory_dir())
        return _fingerprint((disk / f"uid-{user.uid}", memory / f"uid-{user.uid}"))

    def get(self, user: JobUser) -> dict[str, float]:
        mark = self._mark(user)
        with self._mu:
            memo = self._memo.get(user.uid)
            if memo is not None and memo[0] == mark:
                return dict(memo[1])
            if user.uid in self._busy:
                return dict(memo[1]) if memo is not None else {}
            self._busy.add(user.uid)
        try:
            got = fractions_of(self.settings, user, self.python)
            with self._mu:  # as the helper left it: opening the index touches its files
                self._memo[user.uid] = (self._mark(user), got)
            return dict(got)
        finally:
            with self._mu:
                self._busy.discard(user.uid)


class TenantCacheWatch:
    """Every tenant uid's own cache on this node, as `reader_key` entries for the node's
    cache report, so that placement and `dataset list` see what isolated jobs will find (they
    read only their uid's copy, never the shared cache).

    A tenant's cache is read by a helper of its uid (`fractions_of`), on a background thread
    (a helper may take up to REPORT_TIMEOUT_S; the agent's loop must not wait), and only when
    its folders or index changed since the last read or REPORT_MAX_AGE_S passed. The answer is
    a tenant's process's word: it is clamped, bounded to MAX_REPORTED copies, and it only
    names keys of that uid, which only that tenant's jobs are placed by."""

    def __init__(self, settings: CacheSettings, python: str | None = None) -> None:
        self.settings = settings
        self.python = python
        self._mu = threading.Lock()
        self._reports: dict[int, dict[str, float]] = {}
        self._seen: dict[int, tuple[tuple[tuple[int, int], ...], float]] = {}
        self._shared: dict[int, tuple[int, int]] = {}
        """uid -> the share its cache was last held to (a new share is applied at once)."""
        self._busy: threading.Thread | None = None

    def entries(self) -> dict[str, float]:
        """The latest reports, keyed by `reader_key(uid, folder)`."""
        with self._mu:
            return {reader_key(uid, f): frac for uid, held in self._reports.items() for f, frac in held.items()}

    def refresh(self, now: float, wait: bool = False) -> None:
        """Start reading the tenants' caches that changed (on a thread). A refresh still
        running is left to finish; with `wait`, that one and then a new one are waited for."""
        if wait:
            self.close()
        with self._mu:
            if self._busy is not None and self._busy.is_alive():
                return
            worker = threading.Thread(target=self._refresh, args=(now,), name="tenant-cache-report", daemon=True)
            self._busy = worker
        worker.start()
        if wait:
            worker.join()

    def close(self, timeout: float = REPORT_TIMEOUT_S) -> None:
        """Wait for a refresh still running (its helper is bounded by REPORT_TIMEOUT_S)."""
        with self._mu:
            busy = self._busy
        if busy is not None:
            busy.join(timeout)

    def _refresh(self, now: float) -> None:
        here = tenants_here(self.settings)
        share = tenant_share(self.settings)
        uids = {u.uid for u in here}
        with self._mu:
            for uid in [u for u in self._reports if u not in uids]:
                self._reports.pop(uid, None)
                self._seen.pop(uid, None)
                self._shared.pop(uid, None)
        for user, folders in sorted(here.items(), key=lambda kv: kv[0].uid):
            mark = _fingerprint(folders)
            seen = self._seen.get(user.uid)
            fresh = seen is not None and seen[0] == mark and now - seen[1] < REPORT_MAX_AGE_S
            if fresh and self._shared.get(user.uid) == share:
                continue
            self._shared[user.uid] = share
            try:
                held = fractions_of(self.settings, user, self.python, share)
            except OSError as err:  # tried again when the cache changes, or after REPORT_MAX_AGE_S
                log.warning("cannot read the cache of %s: %s", user, err)
                with self._mu:
                    self._seen[user.uid] = (mark, now)
                continue
            kept = dict(sorted((k, v) for k, v in held.items() if _FOLDER.fullmatch(k))[:MAX_REPORTED])
            with self._mu:
                self._reports[user.uid] = kept
                # Marked after the read: opening the index (WAL) touches its files itself. A job
                # that writes meanwhile goes on writing, and its next write is seen.
                self._seen[user.uid] = (_fingerprint(folders), now)


def claim_tiers(settings: CacheSettings) -> list[str]:
    """Make the node cache's two tier folders now, as the plane's (an agent starting, before any
    job of its runs), and check they are: a tier at a predictable name in /dev/shm that a job
    or another user made first would give them every tenant's cache folder inside it. The
    problems, one line each (empty when both are the plane's)."""
    problems = []
    for base in (settings.resolved_disk_dir(), settings.resolved_memory_dir()):
        try:
            _close_tier(plane_owned(plane_dirs(Path(base))))
        except OSError as err:
            problems.append(f"dataset cache: {err}")
    return problems


def _close_tier(base: Path) -> None:
    """Make a tier folder PLANE_DIR_MODE (tenants pass through it to their own `uid-<uid>`
    folder by name, and list nothing) and take group and other access off everything else in
    it: the shared cache's index and dataset folders are the plane's alone. A cache filled
    before isolation was on (or by a plane without it) had them as the plane's umask made them
    (0755 folders, a 0644 index and memory-tier items): every tenant's job could list the tier,
    read the index and read every item another tenant's job had cached there."""
    fd = os.open(base, _DIR_FLAGS)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != PLANE_DIR_MODE:
            os.fchmod(fd, PLANE_DIR_MODE)
        with os.scandir(fd) as entries:
            for e in entries:
                if TENANT_DIR.fullmatch(e.name):
                    continue
                st = e.stat(follow_symlinks=False)
                if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) or not st.st_mode & 0o077:
                    continue
                try:
                    efd = os.open(e.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
                except OSError:
                    continue  # gone meanwhile
                try:
                    est = os.fstat(efd)
                    if est.st_uid == os.geteuid():
                        os.fchmod(efd, stat.S_IMODE(est.st_mode) & 0o700)
                finally:
                    os.close(efd)
    finally:
        os.close(fd)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
