"""Pure parts of the data path: key safety, LRFU eviction order, blocks, the merge tuner,
prefetch sizing and the elastic cache size."""

from __future__ import annotations

import os

import pytest

from sluice.data.blocks import Layout, block_shuffle, pack, packed_size, unpack
from sluice.data.elastic import ElasticInputs, memory_tier_target
from sluice.data.errors import UnsafePath
from sluice.data.eviction import Entry, choose_victims, keep_value
from sluice.data.paths import check_key, inside
from sluice.data.prefetch import workers_for
from sluice.data.tuner import MergeTuner


@pytest.mark.parametrize("key", ["../etc/passwd", "a/../../b", "/etc/passwd", "", "a\x00b", "a\\..\\b", ".sluice-x/y"])
def test_unsafe_keys_are_refused(key: str) -> None:
    with pytest.raises(UnsafePath):
        check_key(key)


def test_safe_keys_are_normalised() -> None:
    assert check_key("./a/b.jpg") == "a/b.jpg"
    assert check_key("a//b") == "a/b"


def test_symlinked_directory_in_cache_is_refused(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(tmp_path, "cache")
    os.makedirs(root)
    outside = os.path.join(tmp_path, "outside")
    os.makedirs(outside)
    os.symlink(outside, os.path.join(root, "evil"))
    with pytest.raises(UnsafePath, match="outside the cache"):
        inside(root, "evil/x.bin")
    os.symlink("/etc/hostname", os.path.join(root, "link.bin"))
    with pytest.raises(UnsafePath, match="symlink"):
        inside(root, "link.bin")
    assert inside(root, "ok/x.bin") == os.path.join(os.path.realpath(root), "ok/x.bin")


def test_eviction_prefers_cold_cheap_large_items() -> None:
    now = 1000.0
    hot = Entry("d", "hot", 100, cost_s=0.01, crf=10.0, last=now)
    cold = Entry("d", "cold", 100, cost_s=0.01, crf=1.0, last=now - 500)
    costly = Entry("d", "costly", 100, cost_s=1.0, crf=1.0, last=now - 500)
    big = Entry("d", "big", 10_000, cost_s=0.01, crf=2.0, last=now)
    order = [e.key for e in choose_victims([hot, cold, costly, big], 10**9, now, lam=0.01)]
    # big has the lowest value per byte, then cold (old, cheap); costly is as cold but 100x dearer to refetch.
    assert order == ["big", "cold", "costly", "hot"]
    assert [e.key for e in choose_victims([hot, cold, costly, big], 50, now, lam=0.01)] == ["big"]


def test_lrfu_lambda_moves_between_frequency_and_recency() -> None:
    now = 100.0
    frequent_old = (50.0, now - 90)  # crf, last
    recent_once = (1.0, now)
    lfu = [keep_value(c, t, 1.0, 1, now, lam=0.0) for c, t in (frequent_old, recent_once)]
    lru = [keep_value(c, t, 1.0, 1, now, lam=1.0) for c, t in (frequent_old, recent_once)]
    assert lfu[0] > lfu[1]
    assert lru[0] < lru[1]


def test_blocks_round_trip_and_layout() -> None:
    items = [os.urandom(n) for n in (10, 0, 300, 7)]
    block = pack(items)
    assert len(block) == packed_size([len(i) for i in items])
    assert [bytes(v) for v in unpack(block)] == items
    with pytest.raises(ValueError):
        unpack(b"XXXX" + block[4:])
    lay = Layout.cut([100] * 10, target=250)
    assert lay.starts == (0, 2, 4, 6, 8, 10)
    assert lay.block_of(5) == 2
    order = block_shuffle(lay, seed=3)
    assert sorted(order) == list(range(10))
    # items of a block stay together
    pos = {i: k for k, i in enumerate(order)}
    for b in range(lay.count):
        ks = sorted(pos[i] for i in lay.span(b))
        assert ks[-1] - ks[0] == len(ks) - 1


def test_tuner_does_not_merge_when_loading_does_not_stall() -> None:
    t = MergeTuner((1 << 20,), stall_threshold=0.05, probe_items=10)
    assert t.current() == 0
    t.record(10, seconds=1.0, stall_s=0.01)
    assert t.decided == 0 and "does not stall" in t.reason


def test_tuner_keeps_a_block_size_only_if_it_beats_unmerged() -> None:
    t = MergeTuner((1 << 20, 4 << 20), probe_items=10)
    t.record(10, 1.0, 0.9)  # unmerged: 10 items/s, stalled
    assert t.current() == 1 << 20
    t.record(10, 0.5, 0.4)  # 20 items/s
    assert t.current() == 4 << 20
    t.record(10, 0.25, 0.2)  # 40 items/s
    assert t.decided == 4 << 20
    slow = MergeTuner((1 << 20,), probe_items=10)
    slow.record(10, 1.0, 0.9)
    slow.record(10, 0.95, 0.9)  # only 5 % better: rejected
    assert slow.decided == 0 and "beat" in slow.reason


def test_prefetch_workers_follow_fetch_over_consume() -> None:
    assert workers_for(0.020, 0.005, cap=16) == 4
    assert workers_for(0.020, 0.0001, cap=16) == 16
    assert workers_for(0.0001, 0.010, cap=16) == 1


def test_elastic_memory_tier_follows_consumption_and_free_memory() -> None:
    gib = 1024**3
    base = dict(dataset_bytes=50 * gib, mem_total=64 * gib, mem_available=48 * gib, current=4 * gib)
    slow = memory_tier_target(ElasticInputs(consume_bytes_per_s=1e6, **base), horizon_s=600)
    fast = memory_tier_target(ElasticInputs(consume_bytes_per_s=50e6, **base), horizon_s=600)
    assert slow < fast
    tight = memory_tier_target(
        ElasticInputs(
            consume_bytes_per_s=50e6, dataset_bytes=50 * gib, mem_total=64 * gib, mem_available=6 * gib, current=4 * gib
        ),
        horizon_s=600,
    )
    assert tight < fast
    assert tight <= int(64 * gib * 0.9) - (64 * gib - 6 * gib - 4 * gib)


def test_cheap_fetches_stay_in_the_consumers_thread_slow_ones_go_to_threads_in_order() -> None:
    """A warm read costs less than a hand-off to a thread: done inline. A slow (remote-like)
    fetch goes to the pool, and items still come back in the order asked."""
    import threading
    import time

    from sluice.data.prefetch import Prefetcher

    seen: list[str] = []

    def cheap(i: int) -> int:
        seen.append(threading.current_thread().name)
        return i

    assert list(Prefetcher(cheap, range(200))) == list(range(200))
    # Nearly all inline: a loaded machine may deschedule this thread mid-read once, and the
    # EWMA then takes a few reads to call the source cheap again.
    inline = sum(1 for name in seen if name == threading.current_thread().name)
    assert inline >= 0.9 * len(seen), f"{len(seen) - inline} of {len(seen)} cheap reads went to threads"

    seen.clear()

    def slow(i: int) -> int:
        seen.append(threading.current_thread().name)
        time.sleep(0.005)
        return i

    order = [5, 3, 9, 1, *range(10, 60)]
    assert list(Prefetcher(slow, order)) == order
    assert any(name.startswith("sluice-prefetch") for name in seen)
