"""Simulated node dataset caches, and the jobs whose time depends on them.

This is what `sluice bench data` scenario 6 measures (data-aware placement, after Kang et
al.): every node keeps whole datasets in a cache of fixed size (least recently used first
out, never one a running job reads); a job reads its dataset once per epoch, and loading
overlaps compute, so an epoch takes max(compute, remote bytes / remote bandwidth + local
bytes / local bandwidth). What a job fetched stays on its node, room permitting.

The SimEngine reports each node's cache as the NodeCache events a real node agent sends, so
the production Controller builds the ClusterView and the real policies place the jobs; the
model here decides only how long they take and how many bytes were read locally.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sluice.model import Allocation, OracleInfo

GB = 10**9


@dataclass
class DataCluster:
    """Every node's cache (dataset -> last use, a logical clock) and the bandwidths of reads."""

    sizes: dict[str, int]
    cache_bytes: int = 600 * GB
    remote_bps: float = 0.5 * GB
    local_bps: float = 4 * GB
    caches: dict[str, dict[str, int]] = field(default_factory=dict)
    readers: dict[str, Counter[str]] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)
    """Nodes whose cache changed since the engine last reported it."""
    _clock: int = 0

    def __post_init__(self) -> None:
        for name, size in self.sizes.items():
            if size <= 0:
                raise ValueError(f"dataset {name}: size must be positive, got {size}")
        if self.cache_bytes < 0 or self.remote_bps <= 0 or self.local_bps <= 0:
            raise ValueError("cache_bytes must be >= 0 and both bandwidths positive")

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def held(self, node: str) -> dict[str, int]:
        return self.caches.setdefault(node, {})

    def free_bytes(self, node: str) -> int:
        return max(0, self.cache_bytes - sum(self.sizes[d] for d in self.held(node)))

    def start_reading(self, node: str, dataset: str) -> tuple[bool, bool]:
        """A job starts reading `dataset` on `node`: (was it cached, is it cached now)."""
        cache = self.held(node)
        hit = dataset in cache
        self.readers.setdefault(node, Counter())[dataset] += 1
        if hit:
            cache[dataset] = self._tick()
            return True, True
        busy = {d for d, n in self.readers[node].items() if n > 0}
        while sum(self.sizes[d] for d in cache) + self.sizes[dataset] > self.cache_bytes:
            victims = [d for d in cache if d not in busy]
            if not victims:
                return False, False
            del cache[min(victims, key=lambda d: cache[d])]
        cache[dataset] = self._tick()
        self.changed.add(node)
        return False, True

    def stop_reading(self, node: str, dataset: str) -> None:
        readers = self.readers.setdefault(node, Counter())
        readers[dataset] = max(0, readers[dataset] - 1)
        cache = self.held(node)
        if dataset in cache:
            cache[dataset] = self._tick()


@dataclass
class DataJob:
    """A job that reads one dataset `epochs` times, `epoch_s` of compute per epoch. Its CPU
    share does not change its speed (its request is what it uses)."""

    cluster: DataCluster
    dataset: str
    epochs: int
    epoch_s: float
    kind: str = "data"
    restarts: int = -1
    epochs_done: float = 0.0
    local_bytes: float = 0.0
    read_bytes: float = 0.0
    finished: bool = False
    _node: str | None = None
    _first_s: float = 0.0
    _later_s: float = 0.0
    _first_until: int = 1
    """Epochs before this one read at the placement's first-epoch speed."""

    @property
    def step(self) -> int:
        return int(self.epochs_done)

    @property
    def total_steps(self) -> int:
        return self.epochs

    @property
    def done(self) -> bool:
        return self.finished

    def place(self, alloc: Allocation) -> None:
        self.restarts += 1
        node = alloc.primary_node
        self._node = node
        size = self.cluster.sizes[self.dataset]
        hit, kept = self.cluster.start_reading(node, self.dataset)
        first_io = size / self.cluster.local_bps if hit else size / self.cluster.remote_bps
        later_io = size / self.cluster.local_bps if kept else size / self.cluster.remote_bps
        self._first_s = max(self.epoch_s, first_io)
        self._later_s = max(self.epoch_s, later_io)
        self._first_until = int(self.epochs_done) + 1
        left = self.epochs - self.epochs_done
        self.read_bytes += left * size
        self.local_bytes += (size if hit else 0.0) + (max(0.0, left - 1) * size if kept else 0.0)

    def reallocate(self, alloc: Allocation) -> bool:
        return False  # a CPU request changes in place; the data stays where it is

    def suspend(self) -> None:
        if self._node is not None:
            self.cluster.stop_reading(self._node, self.dataset)
        self._node = None

    def rollback(self, seconds: float) -> None:
        self.epochs_done = max(0.0, self.epochs_done - seconds / max(self._later_s, 1e-9))

    def _epoch_s(self) -> float:
        return self._first_s if self.epochs_done < self._first_until else self._later_s

    def advance(self, dt: float, cpu: float) -> float | None:
        if self._node is None or self.finished:
            return None
        used = 0.0
        while used < dt - 1e-9:
            per = self._epoch_s()
            to_boundary = (min(self.epochs, int(self.epochs_done) + 1) - self.epochs_done) * per
            if to_boundary > dt - used:
                self.epochs_done += (dt - used) / per
                return None
            used += to_boundary
            self.epochs_done = float(int(self.epochs_done) + 1)
            if self.epochs_done >= self.epochs:
                self.finished = True
                self.suspend()
                return used
        return None

    def cpu_demand(self, alloc: Allocation) -> float:
        return alloc.total_cpu_request

    def loss(self) -> float | None:
        return None

    def speedup(self, alloc: Allocation) -> float:
        return 1.0

    def oracle(self) -> OracleInfo:
        left = self.epochs - self.epochs_done
        return OracleInfo(left * max(self.epoch_s, 1e-9), 0, self.speedup, 0.0)
