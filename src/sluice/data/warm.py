"""Warming one node's cache with a whole dataset, and what that did (`sluice dataset warm`).

Runs where the cache is: in the node agent of each node (the local engine's agent, or the
agent actor on every Ray node), because the cache is a folder on that node. A failure on one
node is reported in that node's result instead of raised, so warming a cluster still says
what every other node did.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice.data.cache import Counters, DatasetCache, dataset_id
from sluice.data.errors import DataError
from sluice.data.guard import SourceGuard


@dataclass(frozen=True)
class WarmReport:
    """What warming did on one node."""

    node: str
    files_fetched: int
    """Items read from the source by this warm (misses)."""
    bytes_fetched: int
    already_cached: int
    """Items this warm found in the node's cache (memory or disk tier)."""
    seconds: float
    cached_fraction: float
    """Share of the dataset's bytes the node holds after the warm."""
    error: str | None = None


def warm_node(
    cache: DatasetCache,
    node: str,
    name: str,
    source: str,
    storage_options: Mapping[str, Any] | None = None,
    workers: int = 16,
    guard: SourceGuard | None = None,
    generation: str = "",
) -> WarmReport:
    """Fetch every item of the dataset into `cache`; count only what this call did (the cache
    keeps one CachedDataset per dataset, whose counters add up over its lifetime).
    `generation`: which registration of the dataset (`dataset_id`), as its jobs open it."""
    t0 = time.perf_counter()
    before = Counters()
    cd = None
    try:
        cd = cache.open(name, source, storage_options, guard=guard, generation=generation)
        before = Counters(**cd.counters.__dict__)
        cd.warm(workers)
        error = None
    except (DataError, OSError, ValueError) as err:
        error = f"{type(err).__name__}: {err}"
    after = cd.counters if cd is not None else before
    try:
        fraction = cache.fractions().get(dataset_id(name, source, storage_options, generation), 0.0)
    except OSError:
        fraction = 0.0
    return WarmReport(
        node=node,
        files_fetched=after.misses - before.misses,
        bytes_fetched=after.fetched_bytes - before.fetched_bytes,
        already_cached=(after.hits_memory + after.hits_disk) - (before.hits_memory + before.hits_disk),
        seconds=round(time.perf_counter() - t0, 3),
        cached_fraction=fraction,
        error=error,
    )
