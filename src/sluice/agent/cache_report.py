"""What the node's dataset cache holds, reported to the control plane for data-aware placement.

The cache itself lives in `sluice.data`; jobs fill it. The agent only looks: every
`interval_s` it reads the cache index and emits a NodeCache event. A node whose cache was
never used has no index yet and reports nothing (and costs nothing).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sluice.data.cache import NodeCache as DatasetCache
from sluice.data.settings import CacheSettings
from sluice.model import NodeCache

log = logging.getLogger("sluice.agent")


class CacheReporter:
    def __init__(self, node: str, home: Path, interval_s: float = 10.0) -> None:
        self.node = node
        self.settings = CacheSettings.for_home(home)
        self.interval_s = interval_s
        self._cache: DatasetCache | None = None
        self._next = 0.0

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

    def poll(self, now: float) -> NodeCache | None:
        if now < self._next:
            return None
        self._next = now + self.interval_s
        cache = self._open()
        if cache is None:
            return None
        try:
            datasets, free = cache.state()
        except Exception as err:  # a busy or damaged index must not stop the agent
            log.warning("cannot read the dataset cache on %s: %s", self.node, err)
            return None
        return NodeCache(self.node, now, datasets, free)
