"""Cost-aware LRFU: which cached items to drop when a tier is full.

LRFU (Lee et al.) keeps per item a combined recency-frequency value
``crf(t) = sum over past accesses a of 2^(-λ (t - t_a))``; λ slides it between LFU (λ=0) and
LRU (λ→1). DLCache's addition is the cost of getting the item back: an item that took 200 ms
to fetch from object storage is worth more per byte than one that came from the local disk.
So the value of keeping an item is ``crf(now) × refetch_cost / size`` and the lowest go first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

_MIN_COST_S = 1e-6


def decay(lam: float, dt: float) -> float:
    """2^(-λ·dt), the weight an access `dt` seconds ago still carries."""
    return float(2.0 ** (-lam * max(0.0, dt)))


def crf_now(crf: float, last: float, now: float, lam: float) -> float:
    return crf * decay(lam, now - last)


def crf_after_accesses(crf: float, last: float, count: int, at: float, lam: float) -> float:
    """The crf after `count` accesses all taken at time `at` (a batch of in-process hits)."""
    return crf * decay(lam, at - last) + count


def keep_value(crf: float, last: float, cost_s: float, size: int, now: float, lam: float) -> float:
    """Benefit per byte of keeping an item: higher is kept longer."""
    return crf_now(crf, last, now, lam) * max(cost_s, _MIN_COST_S) / max(size, 1)


@dataclass(frozen=True)
class Entry:
    ds: str
    key: str
    size: int
    cost_s: float
    crf: float
    last: float


def choose_victims(entries: Iterable[Entry], need_bytes: int, now: float, lam: float) -> list[Entry]:
    """The cheapest-to-lose entries whose sizes add up to at least `need_bytes`."""
    if need_bytes <= 0:
        return []
    ranked = sorted(entries, key=lambda e: (keep_value(e.crf, e.last, e.cost_s, e.size, now, lam), e.last, e.key))
    out: list[Entry] = []
    freed = 0
    for e in ranked:
        if freed >= need_bytes:
            break
        out.append(e)
        freed += e.size
    return out
