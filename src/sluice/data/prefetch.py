"""Fetching ahead of the consumer, with as many workers as the measured speeds call for.

DLCache's rule: workers = ceil(mean fetch time / mean consume time), so fetching keeps just
ahead of training — capped by the CPUs (times a factor, since fetch threads mostly wait on
I/O) and held at one while the node's memory is above the watermark.

A fetch that takes under a millisecond (a warm read from the node cache) is done inline, in
the consumer's thread: through pool threads the same reads made `sluice bench data` scenario
5 (a compute-bound loop) much slower — hand-offs, and threads fighting the training step for
the GIL and the cores. Slower fetches (a remote request, a cache miss) go to the threads,
so slow sources keep DLCache's parallelism.
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

INLINE_BELOW_S = 1e-3
"""A fetch measured below this is done inline. Threads pay only while a fetch mostly waits
(a remote request): a thread reading warm data holds the GIL for its Python parts and, next
to a training step that releases and retakes the GIL around every torch call, costs the step
more than the read itself."""

INLINE_RATIO = 0.05
"""...or when it takes less than this share of the consumer's time per item."""

PROBE_EVERY = 256
"""While fetching through threads, let them drain and fetch one item inline this often, so
that a source that turned cheap (cached by now) goes inline again."""

CALIBRATE_ITEMS = 4
"""The first fetches are inline: they measure what a fetch costs without thread contention
(timed in a pool thread, a 10 us read can look like a millisecond while the consumer holds
the GIL). The Reader starts a new prefetcher per window, so a source that turns warm is
measured again."""

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
        self.inline_s: float | None = None  # EWMA of one fetch done inline (uncontended)
        self.consume_s = 0.0  # EWMA of the consumer's time between items
        self.stall_s = 0.0  # total
        self.items = 0
        self.target = 1  # fetches in flight
        self._last_return: float | None = None
        self._since_probe = 0
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

    def _cheap(self) -> bool:
        """A fetch costs less than handing it to a thread, or is negligible next to consuming:
        then it is done inline, in the consumer's thread (judged on inline fetches only)."""
        if self.inline_s is None:
            return False
        return self.inline_s < INLINE_BELOW_S or self.inline_s < INLINE_RATIO * self.consume_s

    def __next__(self) -> T:
        now = time.perf_counter()
        if self._last_return is not None:
            dt = now - self._last_return
            self.consume_s = dt if self.items <= 1 else (1 - _EWMA) * self.consume_s + _EWMA * dt
        self._retarget(now)
        if not self._queue and (self.items < CALIBRATE_ITEMS or self._cheap() or self._since_probe >= PROBE_EVERY):
            return self._fetch_inline()
        self._top_up()
        if not self._queue:
            self.close()
            raise StopIteration
        fut = self._queue.popleft()
        t0 = time.perf_counter()
        value, dt = fut.result()
        self.stall_s += time.perf_counter() - t0
        self._observe_fetch(dt)
        self._since_probe += 1
        self._top_up()
        return self._done(value)

    def _fetch_inline(self) -> T:
        try:
            i = next(self._order)
        except StopIteration:
            self.close()
            raise
        value, dt = self._timed(i)
        self.inline_s = dt if self.inline_s is None else (1 - _EWMA) * self.inline_s + _EWMA * dt
        self._observe_fetch(dt)
        self.stall_s += dt
        self._since_probe = 0
        return self._done(value)

    def _done(self, value: T) -> T:
        self.items += 1
        self._last_return = time.perf_counter()
        return value

    def _top_up(self) -> None:
        if self._exhausted or self._since_probe >= PROBE_EVERY or self._cheap():
            return  # drain, then fetch inline (to measure again, or because it is cheap)
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
