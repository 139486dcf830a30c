"""A full cache tier is a cache that keeps nothing more, never a read that fails.

Under isolation each tenant's cache had the node's full tier capacities of its own (its share
since s27), and every tenant's memory tier lives on the one tmpfs (/dev/shm) and every disk
tier on the one disk, which a tenant's jobs (and its warms) can fill. Red team s26: with /dev/shm full, another
tenant's job failed every cache miss, and every disk hit (promoted to memory), with
`OSError: [Errno 28] No space left on device` instead of reading its bytes.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import sluice.data.cache as cache_mod
from sluice.data.cache import DatasetCache


def _source(tmp_path: Path, n: int = 4) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(n):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 1000)
    return src


def _full(roots: list[str], code: int = errno.ENOSPC) -> Callable[..., None]:
    real = cache_mod.write_atomic

    def write_atomic(path: str, data: bytes | memoryview, durable: bool = True) -> None:
        if any(path.startswith(r + os.sep) for r in roots):
            raise OSError(code, os.strerror(code), path)
        real(path, data, durable)

    return write_atomic


def test_a_miss_with_the_memory_tier_full_is_cached_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _source(tmp_path)
    cache = DatasetCache(disk_dir=tmp_path / "disk", memory_dir=tmp_path / "mem", memory_bytes=1 << 20)
    monkeypatch.setattr(cache_mod, "write_atomic", _full([cache.memory_dir]))
    ds = cache.open("bob/ds", str(src))
    assert [ds.read(i) for i in range(len(ds))] == [bytes([i]) * 1000 for i in range(4)]
    assert all(os.path.getsize(p) == 1000 for p in ds._disk_paths)  # kept in the tier with room


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_read_with_both_tiers_full_returns_the_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    src = _source(tmp_path)
    cache = DatasetCache(disk_dir=tmp_path / "disk", memory_dir=tmp_path / "mem", memory_bytes=1 << 20)
    ds = cache.open("bob/ds", str(src))
    assert ds.read(0) == bytes([0]) * 1000  # cached before the tiers filled
    os.unlink(ds._mem_paths[0])  # a disk hit now: promoted to memory, which is full
    os.makedirs(os.path.dirname(ds._disk_paths[0]), exist_ok=True)
    with open(ds._disk_paths[0], "wb") as f:
        f.write(bytes([0]) * 1000)
    monkeypatch.setattr(cache_mod, "write_atomic", _full([cache.memory_dir, cache.disk_dir], code))
    assert [ds.read(i) for i in range(len(ds))] == [bytes([i]) * 1000 for i in range(4)]
    ds.warm(workers=2)  # a warm on a full node finishes too (it keeps nothing)


def test_other_write_errors_still_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only "no room" means "not cached": a permission error is still an error."""
    src = _source(tmp_path)
    cache = DatasetCache(disk_dir=tmp_path / "disk", memory_dir=tmp_path / "mem", memory_bytes=1 << 20)
    monkeypatch.setattr(cache_mod, "write_atomic", _full([cache.memory_dir], errno.EACCES))
    ds = cache.open("bob/ds", str(src))
    with pytest.raises(PermissionError):
        ds.read(0)


def test_a_dataset_opens_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its manifest cannot be kept either: it is listed again next time, and read all the same."""
    import sluice.data.manifest as manifest_mod

    def no_room(self: object, path: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    src = _source(tmp_path)
    cache = DatasetCache(disk_dir=tmp_path / "disk", memory_dir=tmp_path / "mem", memory_bytes=1 << 20)
    monkeypatch.setattr(manifest_mod.Manifest, "save", no_room)
    monkeypatch.setattr(cache_mod, "write_atomic", _full([cache.memory_dir, cache.disk_dir]))
    ds = cache.open("bob/ds", str(src))
    assert [ds.read(i) for i in range(len(ds))] == [bytes([i]) * 1000 for i in range(4)]


def test_a_full_disk_under_the_index_does_not_fail_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite answers 'database or disk is full' (SQLITE_FULL) when the disk tier's file system
    is: opening a dataset (which registers it), committing what was cached and folding access
    counts in then failed a job's reads (shown on a full 256 KiB tmpfs). Now the index just
    learns nothing new; what was cached meanwhile is an orphan recovery removes."""
    import sqlite3

    from sluice.data.index import Index

    def full(*_: object, **__: object) -> None:
        err = sqlite3.OperationalError("database or disk is full")
        err.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
        raise err

    src = _source(tmp_path)
    cache = DatasetCache(disk_dir=tmp_path / "disk", memory_dir=tmp_path / "mem", memory_bytes=1 << 20)
    for method in ("register", "add_many", "touch", "remove"):
        monkeypatch.setattr(Index, method, full)
    monkeypatch.setattr(cache_mod, "write_atomic", _full([cache.disk_dir]))
    ds = cache.open("bob/ds", str(src))
    assert [ds.read(i) for i in range(len(ds))] == [bytes([i]) * 1000 for i in range(4)]
    ds.warm(workers=2)
    ds.close()
    cache.drain()
