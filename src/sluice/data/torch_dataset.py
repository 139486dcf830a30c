"""torch Datasets over the node cache: map-style (random access, works with any sampler) and
iterable (streaming epochs with prefetch and online merging).

The map-style dataset offers a sampler that tells the cache which indices come next, so the
cache fetches them ahead of the DataLoader (DLCache's "the sampler's indices are known").
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch.utils.data as tud

from sluice.data.handle import DatasetHandle


class CachedMapDataset(tud.Dataset[Any]):
    def __init__(self, handle: DatasetHandle) -> None:
        self.handle = handle

    def __len__(self) -> int:
        return len(self.handle.reader())

    def __getitem__(self, i: int) -> Any:
        return self.handle.reader().get(int(i))

    @property
    def stall_s(self) -> float:
        """Seconds this process spent waiting for items (in the main process; workers keep their own)."""
        return self.handle.reader().stall_s

    def metrics(self) -> dict[str, float]:
        return self.handle.reader().metrics()

    def sampler(self, shuffle: bool = True, seed: int = 0, lookahead: int = 256) -> PrefetchSampler:
        return PrefetchSampler(self, shuffle=shuffle, seed=seed, lookahead=lookahead)


class PrefetchSampler(tud.Sampler[int]):
    """Yields indices and, meanwhile, has the node cache fetch the next `lookahead` of them."""

    def __init__(self, ds: CachedMapDataset, shuffle: bool = True, seed: int = 0, lookahead: int = 256) -> None:
        self.ds = ds
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.lookahead = lookahead

    def __len__(self) -> int:
        return len(self.ds)

    def __iter__(self) -> Iterator[int]:
        order = list(range(len(self.ds)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.epoch += 1
        reader = self.ds.handle.reader()
        cached = reader.cached
        s = cached.cache.settings
        sem = threading.Semaphore(self.lookahead)
        pool = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 1) * s.prefetch_workers_per_cpu))

        def warm(i: int) -> None:
            try:
                cached.read(i)
            except Exception:  # the DataLoader's own read will raise it with context
                pass
            finally:
                sem.release()

        ahead = 0
        try:
            for pos, i in enumerate(order):
                while ahead < len(order) and ahead < pos + self.lookahead:
                    if not sem.acquire(blocking=False):
                        break
                    pool.submit(warm, order[ahead])
                    ahead += 1
                yield i
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


class CachedStream(tud.IterableDataset[Any]):
    """Streaming epochs: every item once per epoch, block-shuffled, prefetched and merged online
    when loading stalls. With several DataLoader workers, each takes every n-th item."""

    def __init__(self, handle: DatasetHandle, shuffle: bool = True, seed: int = 0) -> None:
        self.handle = handle
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def __iter__(self) -> Iterator[Any]:
        info = tud.get_worker_info()
        reader = self.handle.reader()
        seed = self.seed + self.epoch
        self.epoch += 1
        shard = (info.id, info.num_workers) if info is not None else (0, 1)
        yield from reader.epoch(seed=seed, shuffle=self.shuffle, shard=shard)

    @property
    def stall_s(self) -> float:
        return self.handle.reader().stall_s

    def metrics(self) -> dict[str, float]:
        return self.handle.reader().metrics()
