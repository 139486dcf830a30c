"""Reading a dataset through the node cache: random access by index, or a streamed epoch that
prefetches ahead and merges small files into blocks when (and only when) that pays.

`stall_s` is the time the consumer spent waiting for data; the SDK reports it so the control
plane can tell an I/O-bound job from a compute-bound one.
"""

from __future__ import annotations

import functools
import os
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sluice.data.blocks import Layout, unpack
from sluice.data.cache import CachedDataset
from sluice.data.prefetch import Prefetcher
from sluice.data.tuner import MergeTuner

Decode = Callable[[memoryview | bytes], Any]

BLOCK_CANDIDATES = (1024 * 1024, 4 * 1024 * 1024, 16 * 1024 * 1024)


class Reader:
    """One job's view of a cached dataset."""

    def __init__(
        self,
        cached: CachedDataset,
        decode: Decode | None = None,
        merge: str | int = "auto",
        probe_items: int = 256,
        decode_threads: int | None = None,
    ) -> None:
        self.cached = cached
        self.decode = decode
        s = cached.cache.settings
        self.settings = s
        self._layouts: dict[int, Layout] = {}
        if isinstance(merge, int) and merge > 0:
            self.tuner = MergeTuner((merge,), probe_items=probe_items)
            self.tuner.decided, self.tuner.reason = merge, f"merging into {merge // 1024} KiB blocks (asked for)"
        elif merge == "off" or merge == 0:
            self.tuner = MergeTuner((), probe_items=probe_items)
            self.tuner.decided, self.tuner.reason = 0, "merging off (asked for)"
        else:
            small = all(sz < s.small_file_bytes for sz in cached.sizes[:1000])
            # Blocks already published next to the source are one request each; any other size
            # would be merged online from single files, so only the configured size is tried then.
            published = tuple(t for t in BLOCK_CANDIDATES if cached.source_has_blocks(self.layout(t)))
            candidates = (published or (s.block_bytes,)) if small else ()
            self.tuner = MergeTuner(candidates, s.stall_threshold, probe_items)
        self._decode_pool = (
            ThreadPoolExecutor(max_workers=decode_threads or (os.cpu_count() or 1), thread_name_prefix="sluice-decode")
            if decode is not None
            else None
        )
        self.stall_s = 0.0
        self.items_read = 0
        self.bytes_read = 0
        self.started = time.perf_counter()

    def __len__(self) -> int:
        return len(self.cached)

    def layout(self, target: int) -> Layout:
        if target not in self._layouts:
            self._layouts[target] = self.cached.layout(target)
        return self._layouts[target]

    def get(self, i: int) -> Any:
        """Item `i` (decoded if a decoder was given). With merging on, reads through its block."""
        t0 = time.perf_counter()
        target = self.tuner.decided or 0
        if target:
            lay = self.layout(target)
            b = lay.block_of(i)
            raw: bytes | memoryview = unpack(self.cached.block(lay, b))[i - lay.starts[b]]
        else:
            raw = self.cached.read(i)
        self.stall_s += time.perf_counter() - t0
        self.items_read += 1
        self.bytes_read += len(raw)
        return self.decode(raw) if self.decode else raw

    def epoch(self, seed: int = 0, shuffle: bool = True, shard: tuple[int, int] = (0, 1)) -> Iterator[Any]:
        """Every item once (of this shard: items i with i % n == k), in (block-)shuffled order,
        prefetched ahead of the consumer."""
        n = len(self.cached)
        k, parts = shard
        done = bytearray(n) if parts == 1 else bytearray(0 if i % parts == k else 1 for i in range(n))
        rng = random.Random(seed)
        item_order = list(range(n))
        if shuffle:
            rng.shuffle(item_order)
        pos = 0
        block_orders: dict[int, list[int]] = {}
        while pos < n or any(not d for d in done):
            target = self.tuner.current()
            window = self.tuner.probe_items if self.tuner.decided is None else n
            t0 = time.perf_counter()
            stall0 = self.stall_s
            got = 0
            if target == 0:
                chunk: list[int] = []
                while pos < n and len(chunk) < window:
                    if not done[item_order[pos]]:
                        chunk.append(item_order[pos])
                    pos += 1
                if not chunk:
                    pos = n
                    if all(done):
                        break
                    continue
                pf: Prefetcher[bytes] = Prefetcher(
                    self.cached.read,
                    chunk,
                    watermark=self.settings.memory_watermark,
                    workers_per_cpu=self.settings.prefetch_workers_per_cpu,
                )
                for i, raw in zip(chunk, pf, strict=True):
                    done[i] = 1
                    got += 1
                    self.items_read += 1
                    self.bytes_read += len(raw)
                    yield self.decode(raw) if self.decode else raw
                self.stall_s += pf.stall_s
            else:
                lay = self.layout(target)
                order = block_orders.setdefault(target, self._block_order(lay, rng, shuffle))
                blocks = [b for b in order if any(not done[i] for i in lay.span(b))]
                take: list[int] = []
                count = 0
                for b in blocks:
                    take.append(b)
                    count += sum(1 for i in lay.span(b) if not done[i])
                    if count >= window:
                        break
                if not take:
                    break
                bpf: Prefetcher[memoryview] = Prefetcher(
                    functools.partial(self.cached.block, lay),
                    take,
                    watermark=self.settings.memory_watermark,
                    workers_per_cpu=self.settings.prefetch_workers_per_cpu,
                )
                for b, block in zip(take, bpf, strict=True):
                    items = unpack(block)
                    idx = [i for i in lay.span(b) if not done[i]]
                    if shuffle:
                        rng.shuffle(idx)
                    views = [items[i - lay.starts[b]] for i in idx]
                    if self._decode_pool is not None and self.decode is not None:
                        values = list(self._decode_pool.map(self.decode, views))
                    else:
                        values = list(views)
                    for i, view, v in zip(idx, views, values, strict=True):
                        done[i] = 1
                        got += 1
                        self.items_read += 1
                        self.bytes_read += len(view)
                        yield v
                self.stall_s += bpf.stall_s
            self.tuner.record(got, time.perf_counter() - t0, self.stall_s - stall0)
        self.cached.flush()

    @staticmethod
    def _block_order(lay: Layout, rng: random.Random, shuffle: bool) -> list[int]:
        order = list(range(lay.count))
        if shuffle:
            rng.shuffle(order)
        return order

    def metrics(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started
        return {
            "stall_s": round(self.stall_s, 4),
            "items_read": float(self.items_read),
            "read_bytes_per_s": self.bytes_read / elapsed if elapsed > 0 else 0.0,
            "merge_block_bytes": float(self.tuner.decided or 0),
            **{f"cache_{k}": v for k, v in self.cached.counters.as_dict().items()},
        }

    def close(self) -> None:
        if self._decode_pool is not None:
            self._decode_pool.shutdown(wait=False)
        self.cached.flush()
