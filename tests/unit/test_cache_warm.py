"""`CachedDataset.warm` (what `sluice dataset warm` runs on a node): how much it holds at once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sluice.data.cache import DatasetCache

ITEMS = 40
WORKERS = 4


class Held(bytes):
    """An item's bytes that count themselves while alive."""

    alive = 0
    peak = 0
    lock = threading.Lock()

    def __del__(self) -> None:
        with Held.lock:
            Held.alive -= 1


def test_warm_holds_at_most_its_workers_items_while_an_early_item_is_slow(tmp_path: Path) -> None:
    """Executor.map kept every finished item's bytes until the items before it had finished: a
    slow first item held the rest of the dataset in the warming process's memory."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(ITEMS):
        (src / f"{i:03d}.bin").write_bytes(bytes([i]) * 4096)
    cache = DatasetCache(disk_dir=tmp_path / "disk", memory_dir=tmp_path / "mem", memory_bytes=1 << 30)
    ds = cache.open("w", str(src))
    read, others_done, done = ds.read, threading.Event(), [0]

    def slow_first(i: int) -> bytes:
        if i == 0:
            others_done.wait(10)  # the old code also finishes: it only held more meanwhile
        data = Held(read(i))
        with Held.lock:
            Held.alive += 1
            Held.peak = max(Held.peak, Held.alive)
            done[0] += 1
            if done[0] == ITEMS - 1:
                others_done.set()
        return data

    ds.read = slow_first  # type: ignore[method-assign]
    seen: list[int] = []
    ds.warm(WORKERS, progress=seen.append)
    assert others_done.is_set() and seen == list(range(ITEMS))
    assert ds.counters.misses == ITEMS  # every item fetched once
    assert Held.peak <= WORKERS, f"{Held.peak} items held at once by a warm of {WORKERS} workers"
    ds.close()


def test_warm_stops_at_a_failed_item_and_raises_it(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(ITEMS):
        (src / f"{i:03d}.bin").write_bytes(b"x")
    cache = DatasetCache(disk_dir=tmp_path / "disk", memory_dir=tmp_path / "mem", memory_bytes=1 << 20)
    ds = cache.open("w", str(src))
    read, started = ds.read, []

    def failing(i: int) -> bytes:
        started.append(i)
        if i == 5:
            raise OSError("item 5 is gone")
        return read(i)

    ds.read = failing  # type: ignore[method-assign]
    with pytest.raises(OSError, match="item 5 is gone"):
        ds.warm(WORKERS)
    assert len(started) < ITEMS  # no new item was started once it failed
    ds.close()


def test_warm_does_not_fetch_an_item_no_tier_can_hold(tmp_path: Path) -> None:
    """A tenant's local source held a sparse 1 TiB file: `dataset warm` read it into the
    warming helper, 9 GiB of it before the helper's memory limit killed it, to keep none of it
    (the tenant's cache held 10 GiB). Now such an item is not fetched; the rest is warmed and
    the warm fails naming it (data walk s31)."""
    from sluice.data.errors import DataError

    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"{i:03d}.bin").write_bytes(bytes([i]) * 100)
    with open(src / "big.bin", "wb") as f:
        f.truncate(1 << 20)  # 1 MiB, sparse; the tiers hold 64 KiB each
    cache = DatasetCache(
        disk_dir=tmp_path / "disk", memory_dir=tmp_path / "mem", memory_bytes=64 << 10, disk_bytes=64 << 10
    )
    ds = cache.open("w", str(src))
    fetched: list[str] = []
    fetch = ds.source.fetch

    def counted(key: str, size: int | None = None, what: str = "") -> bytes:
        fetched.append(key)
        return fetch(key, size, what)

    ds.source.fetch = counted  # type: ignore[method-assign]
    with pytest.raises(DataError, match=r"1 item\(s\) larger than this cache can hold .* big\.bin \(1048576 bytes\)"):
        ds.warm(WORKERS)
    assert sorted(fetched) == [f"{i:03d}.bin" for i in range(4)]
    assert ds.counters.misses == 4
    ds.close()


def test_warm_fetches_no_more_than_both_tiers_hold(tmp_path: Path) -> None:
    """A dataset larger than the tenant's memory and disk tiers together was fetched whole,
    each item past the room evicting one fetched before it: the source sent it all to keep
    what its first share would have kept (data walk s31). Now the warm stops at the room and
    says how much it left to the source."""
    from sluice.data.errors import DataError

    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"{i:03d}.bin").write_bytes(bytes([i]) * 10_000)  # 200 kB; the tiers hold 64 + 64 KiB
    cache = DatasetCache(
        disk_dir=tmp_path / "disk", memory_dir=tmp_path / "mem", memory_bytes=64 << 10, disk_bytes=64 << 10
    )
    ds = cache.open("w", str(src))
    with pytest.raises(
        DataError,
        match=r"larger than this cache's memory and disk together \(131072 bytes\): "
        r"7 item\(s\), 70000 bytes, from 013\.bin on, were not fetched",
    ):
        ds.warm(WORKERS)
    assert ds.counters.misses == 13  # 13 × 10,000 bytes, within the tiers' 131,072 (all 20 before)
    ds.close()
    used = sum(u for u, _cap in cache.index.usage().values())
    assert used >= 0.7 * (128 << 10)  # the warm did fill the cache (eviction frees down to 90 % a tier)
