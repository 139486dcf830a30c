"""The agent sizes the node cache's memory tier from what its jobs read (Fluid's autoscaler)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.agent.cache_report import CacheReporter, ConsumptionMeter
from sluice.data.cache import MEMORY, DatasetCache
from sluice.data.settings import CacheSettings
from sluice.model import JobExited, JobProgress


def test_meter_turns_reported_bytes_into_a_rate() -> None:
    m = ConsumptionMeter()
    m.observe(
        [
            JobProgress("a", 1, 10.0, 1, None, {"data_bytes": 0.0}),
            JobProgress("a", 1, 12.0, 2, None, {"data_bytes": 4e6}),
            JobProgress("b", 1, 10.0, 1, None, {"data_bytes": 1e6}),
            JobProgress("b", 1, 11.0, 2, None, {"data_bytes": 2e6}),
        ]
    )
    assert m.bytes_per_s == pytest.approx(2e6 + 1e6)
    m.observe([JobExited("a", 1, 13.0, 0)])
    assert m.bytes_per_s == pytest.approx(1e6)


def test_memory_tier_follows_consumption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLUICE_CACHE_MEMORY_BYTES", raising=False)
    home = tmp_path / "home"
    settings = CacheSettings.for_home(home).model_copy(update={"memory_dir": tmp_path / "shm"})
    cache = DatasetCache(settings, memory_bytes=64 * 1024**2)
    cache.index.register("ds-1", "big", "file:///x", 1000, 10 * 1024**3)  # a 10 GiB dataset
    rep = CacheReporter("n0", settings)
    rep._cache = cache
    # 1 MB/s of reads for a 600 s horizon asks for ~600 MB of memory tier
    events = [
        JobProgress("j", 1, 0.0, 1, None, {"data_bytes": 0.0}),
        JobProgress("j", 1, 10.0, 2, None, {"data_bytes": 10e6}),
    ]
    out = rep.poll(100.0, events)
    assert out is not None and out.node == "n0"
    assert cache.capacity(MEMORY) == pytest.approx(600e6, rel=0.02)
    # the jobs stop reading: nothing to follow, the tier is left alone
    rep.poll(200.0, [JobExited("j", 1, 150.0, 0)])
    assert cache.capacity(MEMORY) == pytest.approx(600e6, rel=0.02)
