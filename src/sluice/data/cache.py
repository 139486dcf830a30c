"""The tiered node cache: memory tier (tmpfs, shared by every job on the node) → disk tier →
source, with cost-aware LRFU eviction, single-flight fetches across processes, and recovery.

Readers take the fast path without touching the index: open the item's file in the memory
tier, then the disk tier. Only a miss takes locks: a byte-range lock per item on a per-dataset
lock file (so two jobs on the node fetch each item once) plus an in-process flight table (so
prefetch threads of one job do too). Access statistics are counted in process and folded into
the shared index every few seconds, which keeps a warm read as cheap as reading tmpfs.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import json
import mmap
import os
import re
import shutil
import sqlite3
import struct
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from sluice.data.blocks import Layout, pack, packed_size, unpack
from sluice.data.errors import CorruptItem, DataError, SourceError, UnsafePath
from sluice.data.files import READ_FLAGS as _RD
from sluice.data.files import map_file, read_exact, tmp_owner, unlink_quiet, write_atomic
from sluice.data.guard import SourceGuard
from sluice.data.index import Index, Victim
from sluice.data.manifest import Manifest
from sluice.data.paths import inside
from sluice.data.settings import CacheSettings
from sluice.data.source import LIST_TIMEOUT_S, Source

MEMORY = "memory"
DISK = "disk"
BLOCKS = ".sluice-blocks"
SOURCE_BLOCKS = "_sluice_blocks"
MANIFEST = ".sluice-manifest.json"

NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""Write errors that mean "this tier's file system has no room for it" (a full disk or tmpfs, a
quota, the job's largest-file limit): the item is then not cached there, and the read goes on."""


def index_full(err: BaseException) -> bool:
    """Whether the index could not be written because its disk is full (SQLITE_FULL): the
    index then learns nothing new (what was cached meanwhile is an orphan recovery removes),
    and the read that wrote it goes on."""
    return isinstance(err, sqlite3.OperationalError) and getattr(err, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


TENANT_DIR = re.compile(r"uid-[0-9]+")
"""A tenant uid's own cache inside a node cache's folders (`uid-<uid>`, under isolation: see
sluice.agent.tenant_cache); not part of the cache whose folders hold it."""

_LOCK_FDS: dict[str, int] = {}
_LOCK_FDS_MU = threading.Lock()


def _lock_fd(path: str) -> int:
    """One fd per lock file per process, never closed: closing any fd of a file drops every POSIX
    lock the process holds on it, which would silently break another reader's single-flight."""
    with _LOCK_FDS_MU:
        fd = _LOCK_FDS.get(path)
        if fd is None or _LOCK_FDS.get(f"{path}#pid") != os.getpid():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            _LOCK_FDS[path] = fd
            _LOCK_FDS[f"{path}#pid"] = os.getpid()
        return fd


_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", None)
_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)


def _range_lock(fd: int, off: int, lock: bool) -> None:
    """Lock or unlock one byte at `off`. Linux open-file-description locks: owned by the fd, not
    the process, so prefetch threads of two jobs waiting on each other's items are not mistaken
    for a deadlock (classic POSIX locks raise EDEADLK there)."""
    if _OFD_SETLKW is not None:
        kind = fcntl.F_WRLCK if lock else fcntl.F_UNLCK
        cmd = int(_OFD_SETLKW if lock else (_OFD_SETLK or _OFD_SETLKW))
        fcntl.fcntl(fd, cmd, struct.pack("hhqqi4x", kind, os.SEEK_SET, off, 1, 0))
    else:
        fcntl.lockf(fd, fcntl.LOCK_EX if lock else fcntl.LOCK_UN, 1, off)


def cache_key(tenant: str, name: str) -> str:
    """The name a registered dataset has in every node's cache: its owner and its name. Two
    tenants' datasets of the same name are two cache entries, reported, warmed and purged apart;
    a dataset an admin published keeps its owner's key, so every tenant's jobs share its cache."""
    return f"{tenant}/{name}"


def dataset_id(name: str, source: str, storage_options: Mapping[str, Any] | None = None, generation: str = "") -> str:
    """Cache folder of a dataset: its name (`tenant/name` flattened to `tenant~name`) plus a hash
    of the name, where the bytes come from and the registration's `generation` (the dataset's
    `created_at`: see `sluice.control.datasets.generation`), so a dataset re-created — with
    another source or the same one — never serves the old bytes, and two tenants never share a
    folder. An unregistered dataset (off-cluster, a bench) has no generation."""
    parts: list[Any] = [name, source, sorted((storage_options or {}).items())]
    if generation:
        parts.append(generation)
    tag = json.dumps(parts, default=str)
    return f"{name.replace('/', '~')}-{hashlib.sha1(tag.encode()).hexdigest()[:10]}"


def reader_key(uid: int, folder: str) -> str:
    """How a node reports one tenant uid's own cached copy (`folder`: a `dataset_id`) under
    isolation, next to the shared cache's `owner/name` keys: that uid's jobs read only their
    own copy, so placement weighs `uid-<uid>:<folder>` for them (see
    `sluice.control.datasets.DatasetService.dataset_bytes`). `:` is in no cache key or folder."""
    return f"uid-{uid}:{folder}"


def folder_pattern(name: str) -> re.Pattern[str]:
    """What the cache folders of every copy of dataset `name` are called (`dataset_id`: any
    source, any generation), and nothing else: `alice~imgs-<hash>`, not `alice~imgs-2-<hash>`."""
    return re.compile(re.escape(name.replace("/", "~")) + r"-[0-9a-f]{10}")


@dataclass
class Counters:
    hits_memory: int = 0
    hits_disk: int = 0
    misses: int = 0
    fetched_bytes: int = 0
    fetch_s: float = 0.0
    corrupt_dropped: int = 0

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


@dataclass
class CacheRecoveryReport:
    temp_files_removed: int = 0
    entries_dropped: int = 0
    orphans_removed: int = 0
    checked: int = 0
    problems: list[str] = field(default_factory=list)


class DatasetCache:
    """The cache of one node. Cheap to construct; every job process makes its own."""

    def __init__(
        self,
        settings: CacheSettings | None = None,
        *,
        disk_dir: str | os.PathLike[str] | None = None,
        memory_dir: str | os.PathLike[str] | None = None,
        memory_bytes: int | None = None,
        disk_bytes: int | None = None,
    ) -> None:
        self.settings = settings or CacheSettings()
        self.disk_dir = os.path.realpath(disk_dir or self.settings.resolved_disk_dir())
        self.memory_dir = os.path.realpath(memory_dir or self.settings.resolved_memory_dir())
        os.makedirs(self.disk_dir, exist_ok=True)
        os.makedirs(self.memory_dir, exist_ok=True)
        self.index = Index(os.path.join(self.disk_dir, "index.sqlite"), self.settings.lrfu_lambda)
        usage = self.index.usage()
        mem = memory_bytes if memory_bytes is not None else self.settings.memory_bytes
        if mem is not None or MEMORY not in usage:
            self.set_capacity(MEMORY, mem if mem is not None else default_memory_bytes())
        # A disk size given explicitly (argument, or SLUICE_CACHE_DISK_BYTES: a tenant's share
        # under isolation) is applied on every open, like the memory tier's; the default only
        # sizes a new index.
        disk = disk_bytes
        if disk is None and "disk_bytes" in self.settings.model_fields_set:
            disk = self.settings.disk_bytes
        if disk is not None or DISK not in usage:
            self.set_capacity(DISK, disk if disk is not None else self.settings.disk_bytes)
        self._open: dict[str, CachedDataset] = {}
        self._pending: list[tuple[str, str, str, int, int, float]] = []
        self._pending_mu = threading.Lock()
        self._drain_mu = threading.Lock()
        self._pending_ev = threading.Event()
        self._writer: threading.Thread | None = None
        # The writer is a daemon thread: commit what it has not yet committed when the job's
        # interpreter exits, or the items a short job fetched become orphans and are deleted.
        atexit.register(self._commit_at_exit)
        self._caps: dict[str, int] = {}
        self._cap_at = 0.0

    def tier_root(self, tier: str) -> str:
        return self.memory_dir if tier == MEMORY else self.disk_dir

    def capacity(self, tier: str) -> int:
        return self.index.usage().get(tier, (0, 0))[1]

    def set_capacity(self, tier: str, capacity: int) -> None:
        """Resize a tier; what no longer fits is demoted (memory → disk) or dropped."""
        self.apply_victims(self.index.set_capacity(tier, capacity))

    def record(self, ds: str, key: str, tier: str, size: int, crc: int, cost: float) -> None:
        """Queue an index entry for an item just renamed into place; a helper thread commits the
        queue in batches. Until then the item is readable (readers do not consult the index) and
        after a crash it is an orphan that recovery removes — never a torn item."""
        with self._pending_mu:
            self._pending.append((ds, key, tier, size, crc, cost))
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._drain_loop, name="sluice-cache-index", daemon=True)
                self._writer.start()
        self._pending_ev.set()

    def _commit_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.drain()

    def _drain_loop(self) -> None:
        while True:
            self._pending_ev.wait(1.0)
            time.sleep(0.02)  # let a burst of fetches land in one transaction
            self._pending_ev.clear()
            if not self.drain():
                with self._pending_mu:
                    if not self._pending:
                        self._writer = None
                        return

    def drain(self) -> int:
        """Commit queued index entries now (and evict what no longer fits); returns how many."""
        with self._drain_mu:
            with self._pending_mu:
                batch, self._pending = self._pending, []
            if batch:
                try:
                    self.apply_victims(self.index.add_many(batch))
                except sqlite3.OperationalError as err:
                    if not index_full(err):
                        raise
            return len(batch)

    def capacity_cached(self, tier: str) -> int:
        """Tier capacity, re-read at most once a second (it only changes when resized)."""
        now = time.monotonic()
        if now - self._cap_at > 1.0:
            self._caps = {t: c for t, (_u, c) in self.index.usage().items()}
            self._cap_at = now
        return self._caps.get(tier, 0)

    def apply_victims(self, victims: list[Victim]) -> None:
        for v in victims:
            path = os.path.join(self.tier_root(v.tier), v.ds, v.key)
            if v.tier == MEMORY and self.capacity(DISK) > 0:
                try:
                    data = read_exact(path, v.size)
                    if data is not None:
                        write_atomic(os.path.join(self.disk_dir, v.ds, v.key), data)
                        self.apply_victims(self.index.add(v.ds, v.key, DISK, len(data), zlib.crc32(data), 0.0))
                except (OSError, ValueError):
                    pass
                except sqlite3.OperationalError as err:
                    if not index_full(err):
                        raise
            unlink_quiet(path)

    def open(
        self,
        name: str,
        source: str,
        storage_options: Mapping[str, Any] | None = None,
        refresh: bool = False,
        guard: SourceGuard | None = None,
        generation: str = "",
    ) -> CachedDataset:
        """The dataset `name` (for a registered dataset, its `cache_key`) through this cache.
        `guard`: the admin's source policy, when sluice fetches on a tenant's behalf;
        `generation`: which registration of the dataset (see `dataset_id`)."""
        ds = dataset_id(name, source, storage_options, generation)
        if not refresh and guard is None and ds in self._open:
            return self._open[ds]
        cd = CachedDataset(
            self,
            name,
            ds,
            Source(source, storage_options, self.settings.retries, self.settings.retry_backoff_s, guard=guard),
            refresh,
        )
        self._open[ds] = cd
        return cd

    def state(self) -> tuple[dict[str, float], int]:
        """(dataset name -> fraction of its bytes held on this node, free bytes in all tiers)."""
        self.drain()
        out: dict[str, float] = {}
        for (_ds, name), frac in index_fractions(self.index).items():
            out[name] = max(out.get(name, 0.0), frac)
        free = sum(max(0, cap - used) for used, cap in self.index.usage().values())
        return out, free

    def fractions(self) -> dict[str, float]:
        """Cache folder (`dataset_id`) -> fraction of that copy's bytes held here: what a reader
        of exactly that copy (one source, one generation) will find, where `state` gives the
        best of every copy of a name."""
        self.drain()
        return {ds: frac for (ds, _name), frac in index_fractions(self.index).items()}

    def remove(self, name: str) -> int:
        """Drop every cached copy of the dataset `name` from this node (every source and
        generation, both tiers, and folders of it the index no longer knows); returns how many
        copies were removed."""
        self.drain()
        gone: set[str] = set()
        for ds, dname, *_ in self.index.datasets():
            if dname == name:
                self.index.drop_dataset(ds)
                gone.add(ds)
        pattern = folder_pattern(name)
        for root in (self.memory_dir, self.disk_dir):
            with contextlib.suppress(FileNotFoundError), os.scandir(root) as entries:
                gone.update(e.name for e in entries if pattern.fullmatch(e.name) and e.is_dir(follow_symlinks=False))
        for ds in gone:
            for root in (self.memory_dir, self.disk_dir):
                shutil.rmtree(os.path.join(root, ds), ignore_errors=True)
            self._open.pop(ds, None)
        return len(gone)

    def recover(self, verify: bool = False) -> CacheRecoveryReport:
        """Make the cache consistent after a crash: remove temp files of dead writers, drop index
        entries whose file is missing or has the wrong size (or CRC, with `verify`), and remove
        files the index does not vouch for. Run by the node agent when it starts."""
        self.drain()
        rep = CacheRecoveryReport()
        known: set[str] = set()
        for ds, key, tier, size, crc in self.index.entries():
            path = os.path.join(self.tier_root(tier), ds, key)
            rep.checked += 1
            ok = False
            with contextlib.suppress(OSError, ValueError):
                if verify:
                    data = read_exact(path, size)
                    ok = data is not None and zlib.crc32(data) == crc
                else:
                    st = os.lstat(path)
                    ok = st.st_size == size and not os.path.islink(path)
            if ok:
                known.add(path)
            else:
                self.index.remove(ds, key, tier)
                unlink_quiet(path)
                rep.entries_dropped += 1
                rep.problems.append(f"{tier}:{ds}/{key}: missing or damaged, dropped")
        for root in (self.memory_dir, self.disk_dir):
            for folder, dirs, files in os.walk(root):
                if folder == root:
                    # Tenants' own caches (isolation): theirs, with an index of their own; never
                    # walked, let alone cleaned, by whoever recovers this one (the agent, as root).
                    dirs[:] = [d for d in dirs if not TENANT_DIR.fullmatch(d)]
                    continue
                for f in files:
                    path = os.path.join(folder, f)
                    owner = tmp_owner(f)
                    if owner is not None:
                        if not psutil.pid_exists(owner) or owner == os.getpid():
                            unlink_quiet(path)
                            rep.temp_files_removed += 1
                        continue
                    if f.startswith(".sluice-") or path in known:
                        continue
                    unlink_quiet(path)
                    rep.orphans_removed += 1
        self.index.recount()
        return rep


def index_fractions(index: Index) -> dict[tuple[str, str], float]:
    """(cache folder, dataset name) -> fraction of that copy's bytes the index vouches for."""
    cached = index.cached_bytes()
    out: dict[tuple[str, str], float] = {}
    for ds, name, _src, _items, total in index.datasets():
        out[(ds, name)] = round(min(1.0, cached.get(ds, 0) / total), 4) if total > 0 else 1.0
    return out


def default_memory_bytes() -> int:
    """A quarter of the node's RAM, bounded by what tmpfs can hold."""
    return int(psutil.virtual_memory().total * 0.25)


class CachedDataset:
    """One dataset seen through the node cache, in one process (threads share it)."""

    def __init__(self, cache: DatasetCache, name: str, ds: str, source: Source, refresh: bool = False) -> None:
        self.cache = cache
        self.name = name
        self.ds = ds
        self.source = source
        self.counters = Counters()
        self._mem_root = os.path.join(cache.memory_dir, ds)
        self._disk_root = os.path.join(cache.disk_dir, ds)
        os.makedirs(self._mem_root, exist_ok=True)
        os.makedirs(self._disk_root, exist_ok=True)
        mpath = os.path.join(self._disk_root, MANIFEST)
        manifest = None if refresh or not os.path.exists(mpath) else Manifest.load(mpath)
        if manifest is None or len(manifest) == 0:  # an empty one may be a vanished source's, kept before
            try:  # listing told "missing" from "empty": list again
                manifest = source.list(timeout_s=LIST_TIMEOUT_S)
            except SourceError as err:  # a job or a warm must say which dataset has no source
                raise SourceError(f"dataset {name!r}: {err}") from err
            try:
                manifest.save(mpath)
            except OSError as err:  # a full disk: listed again next time, not a failed open
                if err.errno not in NO_ROOM:
                    raise
        self.manifest = manifest
        try:
            cache.index.register(ds, name, source.url, len(self.manifest), self.manifest.total_bytes)
        except sqlite3.OperationalError as err:  # a full disk: reported as not cached, read all the same
            if not index_full(err):
                raise
        self.sizes = self.manifest.sizes
        self.keys = self.manifest.keys
        self._mem_paths = [os.path.join(self._mem_root, k) for k in self.keys]
        self._disk_paths = [os.path.join(self._disk_root, k) for k in self.keys]
        self._ok_dirs: set[str] = set()
        self._dirs = [k.rpartition("/")[0] for k in self.keys]
        self._pos = {k: i for i, k in enumerate(self.keys)}
        self._count = [0] * len(self.keys)
        self._last = [0.0] * len(self.keys)
        self._flush_s = cache.settings.stats_flush_s
        self._mu = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self._hits: dict[str, list[float]] = {}
        self._last_flush = time.time()
        self._maps: dict[str, mmap.mmap] = {}

    def __len__(self) -> int:
        return len(self.manifest)

    # -- the read path -----------------------------------------------------------------------
    def read(self, i: int) -> bytes:
        """Item `i`'s bytes: memory tier, disk tier (then promoted), or the source (then cached).

        The memory-tier hit is inlined (one open, one read, one close, two list writes): it is
        what every warm epoch runs per item, and it must cost what reading tmpfs costs."""
        if self._dirs[i] not in self._ok_dirs:
            self._check_dir(self.keys[i])
        size = self.sizes[i]
        try:
            fd = os.open(self._mem_paths[i], _RD)
        except FileNotFoundError:
            return self._read_slow(i)
        try:
            data = os.read(fd, size + 1) if size < 0x7FFFF000 else b""
        finally:
            os.close(fd)
        if len(data) != size:
            return self._read_slow(i)
        self.counters.hits_memory += 1
        self._count[i] += 1
        now = time.time()
        self._last[i] = now
        if now - self._last_flush > self._flush_s:
            self._flush_soon()
        return data

    def _read_slow(self, i: int) -> bytes:
        key = self.keys[i]
        size = self.sizes[i]
        data = self._try(self._mem_paths[i], key, MEMORY, size)
        if data is not None:
            self.counters.hits_memory += 1
            self._hit(key)
            return data
        data = self._try(self._disk_paths[i], key, DISK, size)
        if data is not None:
            self.counters.hits_disk += 1
            self._hit(key)
            self._store(key, data, MEMORY, 0.0)
            return data
        return self._fill(key, ".sluice-locks", i, size, lambda: self.source.fetch(key, size, f"{self.name}/{key}"))

    def view(self, i: int) -> memoryview:
        """Item `i` as a zero-copy view of the shared memory tier (falls back to a copy when the
        memory tier has no room for it)."""
        key = self.keys[i]
        m = self._maps.get(key)
        if m is None:
            data = self.read(i)
            try:
                m = map_file(self._mem_paths[i], self.sizes[i])
            except ValueError:
                m = None
            if m is None:
                return memoryview(data)
            self._maps[key] = m
        else:
            self._hit(key)
        return memoryview(m)

    def _check_dir(self, key: str) -> None:
        d = key.rpartition("/")[0]
        if d in self._ok_dirs:
            return
        inside(self._mem_root, key)
        inside(self._disk_root, key)
        self._ok_dirs.add(d)

    def _try(self, path: str, key: str, tier: str, size: int) -> bytes | None:
        try:
            return read_exact(path, size)
        except ValueError:
            self.counters.corrupt_dropped += 1
            with contextlib.suppress(sqlite3.OperationalError):  # a full disk: recovery drops it
                self.cache.index.remove(self.ds, key, tier)
            unlink_quiet(path)
            return None
        except OSError as err:
            if os.path.islink(path):
                raise UnsafePath(f"{self.name}/{key}: a symlink sits in the cache; refusing to follow it") from err
            raise

    def _hit(self, key: str) -> None:
        now = time.time()
        i = self._pos.get(key)
        if i is not None:
            self._count[i] += 1
            self._last[i] = now
        else:
            with self._mu:
                h = self._hits.get(key)
                if h is None:
                    self._hits[key] = [1.0, now]
                else:
                    h[0] += 1.0
                    h[1] = now
        if now - self._last_flush > self._flush_s:
            self._flush_soon()

    def _flush_soon(self) -> None:
        """Flush from a helper thread, so no read waits on the index."""
        self._last_flush = time.time()
        threading.Thread(target=self.flush, name="sluice-cache-stats", daemon=True).start()

    def flush(self) -> None:
        """Fold this process's access counts into the shared LRFU statistics."""
        with self._mu:
            hits, self._hits = self._hits, {}
            counts, self._count = self._count, [0] * len(self.keys)
            last = self._last
            self._last_flush = time.time()
        self.cache.drain()
        batch = [(k, int(c), t) for k, (c, t) in hits.items()]
        batch += [(self.keys[i], c, last[i]) for i, c in enumerate(counts) if c]
        try:
            self.cache.index.touch(self.ds, batch)
        except sqlite3.OperationalError as err:  # a full disk: these counts are lost
            if not index_full(err):
                raise

    def _fill(self, key: str, lockfile: str, off: int, size: int, produce: Callable[[], bytes]) -> bytes:
        """Single-flight miss: one thread of one process on the node fetches; the rest wait and
        read what it cached."""
        with self._mu:
            ev = self._inflight.get(key)
            leader = ev is None
            if ev is None:
                ev = self._inflight[key] = threading.Event()
        if not leader:
            ev.wait()
            data = self._cached(key, size)
            if data is not None:
                return data
            return self._fetch_store(key, size, produce)
        try:
            fd = _lock_fd(os.path.join(self._disk_root, lockfile))
            _range_lock(fd, off, True)
            try:
                data = self._cached(key, size)
                if data is not None:
                    return data
                return self._fetch_store(key, size, produce)
            finally:
                _range_lock(fd, off, False)
        finally:
            with self._mu:
                self._inflight.pop(key, None)
            ev.set()

    def _cached(self, key: str, size: int) -> bytes | None:
        for tier, root in ((MEMORY, self._mem_root), (DISK, self._disk_root)):
            data = self._try(os.path.join(root, key), key, tier, size)
            if data is not None:
                if tier == MEMORY:
                    self.counters.hits_memory += 1
                else:
                    self.counters.hits_disk += 1
                self._hit(key)
                return data
        return None

    def _fetch_store(self, key: str, size: int, produce: Callable[[], bytes]) -> bytes:
        t0 = time.perf_counter()
        data = produce()
        cost = time.perf_counter() - t0
        if len(data) != size:
            raise CorruptItem(f"{self.name}/{key}: produced {len(data)} bytes, {size} expected; not cached")
        self.counters.misses += 1
        self.counters.fetched_bytes += size
        self.counters.fetch_s += cost
        self._store(key, data, MEMORY, cost)
        return data

    def _store(self, key: str, data: bytes, tier: str, cost: float) -> None:
        """Cache `data` in `tier` (memory falls through to disk when it has no room).

        A tier's file system may be full whatever its capacity says: every tenant's memory tier
        lives on the one tmpfs, every disk tier on the one disk, and a tenant's jobs can fill
        either. No room there (NO_ROOM) moves on to the disk tier, then to keeping nothing: the
        caller has the bytes, and a cache that cannot keep them must not fail the read."""
        if tier == MEMORY and self.cache.capacity_cached(MEMORY) < len(data):
            tier = DISK
        if self.cache.capacity_cached(tier) < len(data):
            return
        root = self._mem_root if tier == MEMORY else self._disk_root
        path = inside(root, key) if not key.startswith(BLOCKS) else os.path.join(root, key)
        try:
            write_atomic(path, data, durable=tier == DISK)
        except OSError as err:
            if err.errno not in NO_ROOM:
                raise
            if tier == MEMORY:
                self._store(key, data, DISK, cost)
            return
        self.cache.record(self.ds, key, tier, len(data), zlib.crc32(data), cost)

    # -- merged blocks -----------------------------------------------------------------------
    def layout(self, target: int | None = None) -> Layout:
        return Layout.cut(self.sizes, target or self.cache.settings.block_bytes)

    def block(self, layout: Layout, b: int) -> memoryview:
        """Block `b` as one zero-copy mapping: from the cache, else the source's published block,
        else merged online from the block's items (and cached for every later reader)."""
        key = f"{BLOCKS}/{layout.key(b)}"
        m = self._maps.get(key)
        if m is not None:
            self._hit(key)
            return memoryview(m)
        span = layout.span(b)
        size = packed_size([self.sizes[i] for i in span])

        def produce() -> bytes:
            remote = f"{SOURCE_BLOCKS}/{layout.key(b)}"
            if self.source_has_blocks(layout):
                return self.source.fetch_raw(remote, size)
            from concurrent.futures import ThreadPoolExecutor

            workers = min(len(span), (os.cpu_count() or 1) * self.cache.settings.prefetch_workers_per_cpu)
            with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="sluice-merge") as pool:
                return pack(list(pool.map(self._item_bytes, span)))

        data: bytes | None = self._cached(key, size)
        if data is None:
            data = self._fill(key, f".sluice-locks-{layout.target}", b, size, produce)
        for root in (self._mem_root, self._disk_root):
            try:
                mm = map_file(os.path.join(root, key), size)
            except ValueError:
                mm = None
            if mm is not None:
                self._maps[key] = mm
                return memoryview(mm)
        return memoryview(data)

    def _item_bytes(self, i: int) -> bytes:
        """An item for merging: from the cache if it is there, else the source (not cached on its
        own — it is about to live in the block)."""
        key, size = self.keys[i], self.sizes[i]
        for path in (self._mem_paths[i], self._disk_paths[i]):
            data = self._try(path, key, MEMORY if path is self._mem_paths[i] else DISK, size)
            if data is not None:
                return data
        return self.source.fetch(key, size, f"{self.name}/{key}")

    def block_items(self, layout: Layout, b: int) -> list[memoryview]:
        return unpack(self.block(layout, b))

    _has_blocks: dict[int, bool]

    def source_has_blocks(self, layout: Layout) -> bool:
        """Whether merged blocks of this layout were published next to the source."""
        cache = self.__dict__.setdefault("_has_blocks", {})
        if layout.target not in cache:
            cache[layout.target] = self.source.exists(f"{SOURCE_BLOCKS}/{layout.target}/{layout.count - 1:06d}.blk")
        return bool(cache[layout.target])

    def publish_blocks(self, layout: Layout, progress: Callable[[int], None] | None = None) -> int:
        """Write this dataset's merged blocks next to the source (for writable sources), so cold
        readers on other nodes fetch one object per block instead of one per file."""
        for b in range(layout.count):
            data = bytes(self.block(layout, b))
            self.source.put(f"{SOURCE_BLOCKS}/{layout.key(b)}", data)
            if progress:
                progress(b)
        self.__dict__.setdefault("_has_blocks", {})[layout.target] = True
        return layout.count

    # -- bulk --------------------------------------------------------------------------------
    def warm(self, workers: int = 8, progress: Callable[[int], None] | None = None) -> Counters:
        """Fetch every item into the cache (what `sluice dataset warm` runs).

        At most `workers` items are in this process's memory at once, each only until it is
        cached: `Executor.map` submitted every item up front and kept each finished item's bytes
        until all before it had finished, so one slow early item held the rest of the dataset in
        memory. `progress(n)` is called with the number of items done, less one. The first
        failure is raised once the items under way have finished; no new item is started.

        An item larger than either tier can hold is not fetched (the cache would drop it, and
        a 1 TiB item of a tenant's source took 9 GiB of the warming helper's memory before its
        memory limit stopped it): the rest is warmed, then a DataError names it. Likewise a
        dataset larger than both tiers together is warmed only as far as they hold: every item
        past that evicted one fetched before it, so the warm fetched the whole dataset (the
        tenant's source paying for it) to keep what the first share of it would have kept."""
        from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

        def fetch(i: int) -> None:
            self.read(i)  # cached by the read; the bytes are dropped here

        room = max(self.cache.capacity(MEMORY), self.cache.capacity(DISK))
        too_big = [i for i in range(len(self)) if self.sizes[i] > room]
        both = self.cache.capacity(MEMORY) + self.cache.capacity(DISK)  # memory's evictions go to disk
        left, past_room = both, []
        for i in range(len(self)):  # in order, as long as the tiers' capacity lasts
            if self.sizes[i] <= room:
                if self.sizes[i] > left:
                    past_room.append(i)
                else:
                    left -= self.sizes[i]
        skip = set(too_big) | set(past_room)
        workers = max(1, workers)
        done = 0
        under_way: set[Future[None]] = set()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for i in range(len(self)):
                if i in skip:
                    continue
                under_way.add(pool.submit(fetch, i))
                if len(under_way) < workers:
                    continue
                finished, under_way = wait(under_way, return_when=FIRST_COMPLETED)
                for f in finished:
                    f.result()  # a failed item stops the warm here
                    done += 1
                    if progress:
                        progress(done - 1)
            for f in wait(under_way).done:
                f.result()
                done += 1
                if progress:
                    progress(done - 1)
        self.flush()
        problems = []
        if too_big:
            big = max(too_big, key=lambda j: self.sizes[j])
            problems.append(
                f"{len(too_big)} item(s) larger than this cache can hold ({room} bytes in a tier), "
                f"the largest {self.keys[big]} ({self.sizes[big]} bytes), were not fetched"
            )
        if past_room:
            problems.append(
                f"the dataset ({sum(self.sizes)} bytes) is larger than this cache's memory and disk together "
                f"({both} bytes): {len(past_room)} item(s), {sum(self.sizes[i] for i in past_room)} bytes, "
                f"from {self.keys[past_room[0]]} on, were not fetched"
            )
        if problems:
            raise DataError(f"{self.name}: " + "; ".join(problems) + "; jobs read them from the source")
        return self.counters

    def close(self) -> None:
        self.flush()
        for m in self._maps.values():
            with contextlib.suppress(BufferError):
                m.close()
        self._maps.clear()
