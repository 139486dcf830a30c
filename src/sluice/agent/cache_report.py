"""The node's dataset cache, as the agent sees it: reported for placement, sized to demand.

The cache itself lives in `sluice.data`; jobs fill it. The agent:
- every `interval_s` reads the cache index and emits a NodeCache event, so data-aware
  placement knows which node holds which dataset;
- follows the `data_bytes` metric jobs report (bytes read through the cache) and resizes the
  memory tier with `sluice.data.elastic.memory_tier_target` — Fluid's autoscaler on one node:
  enough for the horizon of consumption, never past the memory watermark. An operator's fixed
  size (SLUICE_CACHE_MEMORY_BYTES) turns this off.
Under tenant isolation each tenant uid's own cache (the only one its jobs read) is reported
too, as `reader_key` entries (`sluice.agent.tenant_cache.TenantCacheWatch`).
A node whose cache was never used has no index yet, reports nothing and costs nothing.
"""

from __future__ import annotations

import logging
import shutil

import psutil

from sluice.agent.tenant_cache import TenantCacheWatch
from sluice.data.cache import MEMORY, DatasetCache
from sluice.data.elastic import ElasticInputs, memory_tier_target
from sluice.data.settings import CacheSettings
from sluice.model import Event, JobExited, JobProgress, NodeCache

log = logging.getLogger("sluice.agent")

RESIZE_THRESHOLD = 0.10
"""Resize the memory tier only when the target moves by more than this fraction."""


class ConsumptionMeter:
    """Bytes per second the node's jobs read through the cache, from their `data_bytes` reports."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}
        self._rate: dict[str, float] = {}

    def observe(self, events: list[Event]) -> None:
        for e in events:
            if isinstance(e, JobProgress) and "data_bytes" in e.metrics:
                seen = e.metrics["data_bytes"]
                prev = self._last.get(e.job_id)
                if prev is not None and e.time > prev[0] and seen >= prev[1]:
                    self._rate[e.job_id] = (seen - prev[1]) / (e.time - prev[0])
                self._last[e.job_id] = (e.time, seen)
            elif isinstance(e, JobExited):
                self._last.pop(e.job_id, None)
                self._rate.pop(e.job_id, None)

    @property
    def bytes_per_s(self) -> float:
        return sum(self._rate.values())


class CacheReporter:
    def __init__(
        self, node: str, settings: CacheSettings, interval_s: float = 10.0, job_python: str | None = None
    ) -> None:
        """`settings`: the node's cache (`sluice.settings.Settings.cache`). `job_python`: the
        interpreter tenants' jobs run, which reads each tenant's own cache as its uid."""
        self.node = node
        self.settings = settings
        self.interval_s = interval_s
        self.meter = ConsumptionMeter()
        self.tenants = TenantCacheWatch(settings, job_python)
        self._cache: DatasetCache | None = None
        self._next = 0.0
        self._reported_own = False

    def _open(self) -> DatasetCache | None:
        if self._cache is None and (self.settings.resolved_disk_dir() / "index.sqlite").exists():
            self._cache = DatasetCache(self.settings)
        return self._cache

    def recover(self) -> None:
        """After a crash: drop torn or unindexed items so no job is served a partial file."""
        cache = self._open()
        if cache is not None:
            report = cache.recover()
            if report.problems or report.temp_files_removed or report.entries_dropped:
                log.warning("dataset cache recovered on %s: %s", self.node, report)

    def poll(self, now: float, events: list[Event]) -> NodeCache | None:
        self.meter.observe(events)
        if now < self._next:
            return None
        self._next = now + self.interval_s
        self.tenants.refresh(now)
        own = self.tenants.entries()  # what the last refresh found (this one's, next time)
        cache = self._open()
        if cache is None:
            if not own and not self._reported_own:
                return None
            self._reported_own = bool(own)  # one empty report after the last copy went
            return NodeCache(self.node, now, own, self._disk_free())
        try:
            self._autoscale(cache)
            datasets, free = cache.state()
        except Exception as err:  # a busy or damaged index must not stop the agent
            log.warning("cannot read the dataset cache on %s: %s", self.node, err)
            return None
        return NodeCache(self.node, now, {**datasets, **own}, free)

    def close(self) -> None:
        self.tenants.close()

    def _disk_free(self) -> int:
        """Room for a cache that has no index of its own yet (only tenants' caches, under
        isolation): what the disk tier's file system has free."""
        try:
            return int(shutil.disk_usage(self.settings.resolved_disk_dir()).free)
        except OSError:
            return 0

    def _autoscale(self, cache: DatasetCache) -> int | None:
        """Set the memory tier to what consumption asks; returns the new capacity if changed."""
        if self.settings.memory_bytes is not None or self.meter.bytes_per_s <= 0:
            return None
        mem = psutil.virtual_memory()
        current = cache.capacity(MEMORY)
        target = memory_tier_target(
            ElasticInputs(
                consume_bytes_per_s=self.meter.bytes_per_s,
                dataset_bytes=sum(total for *_, total in cache.index.datasets()),
                mem_total=mem.total,
                mem_available=mem.available,
                current=current,
            ),
            watermark=self.settings.memory_watermark,
        )
        if current and abs(target - current) / current <= RESIZE_THRESHOLD:
            return None
        cache.set_capacity(MEMORY, target)
        log.info(
            "memory tier on %s: %d -> %d bytes (%.0f B/s consumed)", self.node, current, target, self.meter.bytes_per_s
        )
        return target
