"""A picklable description of "this dataset through this node's cache".

DataLoader workers may be forked or spawned; SQLite connections, locks and mmaps must not
cross either. So what travels is this handle, and each process opens its own reader lazily.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from sluice.data.cache import DatasetCache
from sluice.data.reader import Decode, Reader


@dataclass
class DatasetHandle:
    name: str
    source: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    disk_dir: str | None = None
    memory_dir: str | None = None
    merge: str | int = "auto"
    decode: Decode | None = None
    generation: str = ""
    """Which registration of the dataset (SLUICE_DATASETS' `generation`): part of its cache folder."""
    _reader: Reader | None = field(default=None, repr=False, compare=False)
    _pid: int = field(default=0, repr=False, compare=False)

    def reader(self) -> Reader:
        if self._reader is None or self._pid != os.getpid():
            cache = DatasetCache(disk_dir=self.disk_dir, memory_dir=self.memory_dir)
            cached = cache.open(self.name, self.source, self.storage_options, generation=self.generation)
            self._reader = Reader(cached, decode=self.decode, merge=self.merge)
            self._pid = os.getpid()
        return self._reader

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_reader"] = None
        state["_pid"] = 0
        return state
