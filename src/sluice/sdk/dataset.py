"""`sluice.sdk.dataset(name)`: a torch Dataset that reads through the node's cache.

    from sluice import sdk
    from sluice.sdk.dataset import dataset

    train = dataset("imagenet-mini")                     # map-style: any sampler, any DataLoader
    loader = DataLoader(train, batch_size=64, sampler=train.sampler(), num_workers=2)
    stream = dataset("imagenet-mini", streaming=True)    # iterable: prefetch + online merging

Where the dataset lives comes from the environment the node agent sets (SLUICE_DATASETS, a
JSON map name -> {"source": url, "storage_options": {...}, "cache_key": "owner/name",
"generation": "..."}); off-cluster, pass `source=` or a
local path as the name. The data path is imported only when this function is called, so
importing the SDK stays cheap. Stall time (seconds spent waiting for data) is added as the
`stall_s` metric to every `sdk.report()` of the process.
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Callable
from typing import Any

_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()


def _resolve(
    name: str, source: str | None, storage_options: dict[str, Any] | None
) -> tuple[str, dict[str, Any], str | None, str]:
    """(source, storage options, the dataset's key in the node cache when sluice mounted it,
    which registration of it that is: its `generation`, "" off-cluster)."""
    if source is not None:
        return source, dict(storage_options or {}), None, ""
    raw = os.environ.get("SLUICE_DATASETS")
    if raw:
        try:
            table = json.loads(raw)
        except ValueError as err:
            raise ValueError(f"SLUICE_DATASETS is not valid JSON: {err}") from None
        entry = table.get(name)
        if isinstance(entry, dict) and isinstance(entry.get("source"), str):
            key = entry.get("cache_key")
            gen = entry.get("generation")
            opts = {**entry.get("storage_options", {}), **(storage_options or {})}
            return entry["source"], opts, key if isinstance(key, str) else None, gen if isinstance(gen, str) else ""
    if os.path.isdir(name):
        return os.path.abspath(name), dict(storage_options or {}), None, ""
    known = ", ".join(sorted(json.loads(raw))) if raw else "none"
    raise ValueError(
        f"dataset {name!r}: not mounted in this job (datasets given to it: {known}); "
        "add it to the job spec's `datasets`, or pass source=<path or URL> when running off-cluster"
    )


def dataset(
    name: str,
    *,
    source: str | None = None,
    storage_options: dict[str, Any] | None = None,
    decode: Callable[[memoryview | bytes], Any] | None = None,
    streaming: bool = False,
    merge: str | int = "auto",
    shuffle: bool = True,
    seed: int = 0,
) -> Any:
    """A map-style torch Dataset (or an IterableDataset with `streaming=True`) over `name`.

    decode: turns an item's bytes into a sample (e.g. decode an image); runs in parallel per
            merged block. merge: "auto" (probe, merge only if loading stalls), "off", or a
            block size in bytes.
    """
    from sluice.data.handle import DatasetHandle
    from sluice.data.torch_dataset import CachedMapDataset, CachedStream

    src, opts, key, generation = _resolve(name, source, storage_options)
    handle = DatasetHandle(
        # The cache entry is per tenant (`owner/name`, from SLUICE_DATASETS), so two tenants'
        # datasets of one name never share cached bytes; its generation changes when the
        # dataset is deleted and registered again, so a re-created one never reads old bytes.
        name=key or (os.path.basename(name.rstrip("/")) if name == src else name),
        generation=generation,
        source=src,
        storage_options=opts,
        disk_dir=os.environ.get("SLUICE_CACHE_DISK_DIR"),
        memory_dir=os.environ.get("SLUICE_CACHE_MEMORY_DIR"),
        merge=merge,
        decode=decode,
    )
    ds: Any = CachedStream(handle, shuffle=shuffle, seed=seed) if streaming else CachedMapDataset(handle)
    _OPEN.add(ds)
    return ds


CACHE_METRIC = "cache:"
"""Prefix of the per-dataset cache counters in a progress record: `cache:<owner/name>:<counter>`."""


def data_metrics() -> dict[str, float]:
    """Summed over the datasets this process opened: what `sdk.report()` adds to each record."""
    stall = 0.0
    read = 0
    cache: dict[str, float] = {}
    for ds in list(_OPEN):
        reader = ds.handle._reader
        if reader is not None:
            stall += reader.stall_s
            read += reader.bytes_read
            # Per-dataset cache counters (cumulative in this process), keyed by the cache key
            # (`owner/name`): the control plane's /metrics turns them into per-dataset counters.
            c = reader.cached.counters
            for what, v in (("hits_memory", c.hits_memory), ("hits_disk", c.hits_disk), ("misses", c.misses)):
                k = f"{CACHE_METRIC}{ds.handle.name}:{what}"
                cache[k] = cache.get(k, 0.0) + float(v)
    # data_bytes lets the node agent size the cache's memory tier to what jobs consume
    return {"stall_s": round(stall, 4), "data_bytes": float(read), **cache} if _OPEN else {}
