"""Fetching ahead of the consumer, with as many workers as the measured speeds call for.

DLCache's rule: workers = ceil(mean fetch time / mean consume time), so fetching keeps just
ahead of training — capped by the CPUs (times a factor, since fetch threads mostly wait on
I/O) and held at one while the node's memory is above the watermark. When fetching is far
faster than consuming the prefetcher fetches inline, with no thread hand-off at all, because
the data path must cost next to nothing for a job that is not waiting on data.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import psutil

T = TypeVar("T")

INLINE_RATIO = 0.05
"""Fetch inline while a fetch takes less than this share of the consume time."""

_EWMA = 0.1


def workers_for(fetch_s: float, consume_s: float, cap: int) -> int:
    """ceil(fetch / consume), at least 1 and at most `cap`."""
    if consume_s <= 0:
        return cap if fetch_s > 0 else 1
    return max(1, min(cap, math.ceil(fetch_s / consume_s)))


def memory_pressed(watermark: float) -> bool:
    return psutil.virtual_memory().percent >= watermark * 100.0


class Prefetcher(Generic[T]):
    """Iterate `fetch(i)` for `i` in `order`, fetching ahead. Reports stall time: how long the
    consumer waited for data that was not there yet."""

    def __init__(
        self,
        fetch: Callable[[int], T],
        order: Iterable[int],
        max_workers: int | None = None,
        watermark: float = 0.90,
        workers_per_cpu: int = 8,
    ) -> None:
        self.fetch = fetch
        self._order = iter(order)
        self.cap = max_workers or max(1, (os.cpu_count() or 1) * workers_per_cpu)
        self.watermark = watermark
        self._pool: ThreadPoolExecutor | None = None
        self._queue: deque[Future[tuple[T, float]]] = deque()
        self._exhausted = False
        self.fetch_s = 0.0  # EWMA of one fetch
        self.consume_s = 0.0  # EWMA of the consumer's time between items
        self.stall_s = 0.0  # total
        self.items = 0
        self.target = 1
        self._last_return: float | None = None
        self._mem_checked = 0.0
        self._pressed = False

    def __iter__(self) -> Iterator[T]:
        return self

    def _timed(self, i: int) -> tuple[T, float]:
        t0 = time.perf_counter()
        v = self.fetch(i)
        return v, time.perf_counter() - t0

    def _observe_fetch(self, dt: float) -> None:
        self.fetch_s = dt if self.items == 0 else (1 - _EWMA) * self.fetch_s + _EWMA * dt

    def _retarget(self, now: float) -> None:
        if now - self._mem_checked > 0.5:
            self._mem_checked = now
            self._pressed = memory_pressed(self.watermark)
        self.target = 1 if self._pressed else workers_for(self.fetch_s, self.consume_s, self.cap)

    def _inline(self) -> bool:
        return not self._queue and self.items > 0 and self.fetch_s < INLINE_RATIO * self.consume_s

    def __next__(self) -> T:
        now = time.perf_counter()
        if self._last_return is not None:
            dt = now - self._last_return
            self.consume_s = dt if self.items <= 1 else (1 - _EWMA) * self.consume_s + _EWMA * dt
        self._retarget(now)
        if self._inline():
            try:
                i = next(self._order)
            except StopIteration:
                self.close()
                raise
            value, dt = self._timed(i)
            self._observe_fetch(dt)
            self.stall_s += dt
            return self._done(value)
        self._top_up()
        if not self._queue:
            self.close()
            raise StopIteration
        fut = self._queue.popleft()
        t0 = time.perf_counter()
        value, dt = fut.result()
        self.stall_s += time.perf_counter() - t0
        self._observe_fetch(dt)
        self._top_up()
        return self._done(value)

    def _done(self, value: T) -> T:
        self.items += 1
        self._last_return = time.perf_counter()
        return value

    def _top_up(self) -> None:
        if self._exhausted:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.cap, thread_name_prefix="sluice-prefetch")
        while len(self._queue) < self.target:
            try:
                i = next(self._order)
            except StopIteration:
                self._exhausted = True
                return
            self._queue.append(self._pool.submit(self._timed, i))

    def close(self) -> None:
        for f in self._queue:
            f.cancel()
        self._queue.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
