"""Elastic cache size (Fluid's autoscaler, on one node): the memory tier grows to hold what the
jobs reading through it consume within a horizon, and shrinks when the node needs the memory.

Pure function over measurements, so the agent can call it every few seconds and tests can
check it with plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ElasticInputs:
    consume_bytes_per_s: float
    """Sum over the node's jobs of the bytes per second they read through the cache."""
    dataset_bytes: int
    """Bytes of the datasets those jobs read (the most worth holding)."""
    mem_total: int
    mem_available: int
    current: int
    """Current memory-tier capacity in bytes."""


def memory_tier_target(
    x: ElasticInputs, horizon_s: float = 600.0, watermark: float = 0.90, floor: int = 64 * 1024**2
) -> int:
    """Capacity to set: enough for `horizon_s` of consumption (capped by the datasets' size), but
    never so much that the node's memory use would pass `watermark`."""
    want = min(float(x.dataset_bytes), x.consume_bytes_per_s * horizon_s)
    used_by_others = x.mem_total - x.mem_available - x.current
    ceiling = int(x.mem_total * watermark) - max(0, used_by_others)
    return max(floor, min(int(want), max(0, ceiling)))
