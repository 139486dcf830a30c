"""An S3 dataset source with injected latency and bandwidth: moto in server mode on loopback,
sluice's shaping proxy (sluice.data.s3proxy) in front of it, read through the node cache.

Real parts only: a real S3-compatible server, a real proxy, s3fs/botocore as the client.
Timing is asserted only as lower bounds (a request cannot be answered before the injected
latency has passed), never as an upper bound a slow machine could break.
"""

from __future__ import annotations

import random
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.data.cache import DatasetCache
from sluice.data.s3proxy import ShapingProxy
from sluice.data.source import Source

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LATENCY_S = 0.05
BANDWIDTH_BPS = 1_000_000.0


@pytest.fixture
def moto(moto_s3: tuple[str, Any]) -> tuple[str, dict[str, bytes]]:
    """Bucket `data` of the loopback moto server with 20 small objects and one of 200 kB."""
    endpoint, s3 = moto_s3
    rng = random.Random(7)
    objects = {f"c{i % 3}/x{i:03d}.bin": rng.randbytes(rng.randint(100, 6000)) for i in range(20)}
    objects["big/blob.bin"] = rng.randbytes(200_000)
    for key, body in objects.items():
        s3.put_object(Bucket="data", Key=f"set/{key}", Body=body)
    return endpoint, objects


@pytest.fixture
def cache_dirs(tmp_path: Path) -> Iterator[tuple[str, str]]:
    mem = f"/dev/shm/sluice-test-{uuid.uuid4().hex[:8]}"
    try:
        yield str(tmp_path / "disk"), mem
    finally:
        shutil.rmtree(mem, ignore_errors=True)


def opts(url: str) -> dict[str, object]:
    return {"endpoint_url": url, "key": "k", "secret": "s", "client_kwargs": {"region_name": "us-east-1"}}


def test_s3_through_the_shaping_proxy_reads_correctly_and_pays_the_latency(moto, cache_dirs) -> None:
    endpoint, objects = moto
    with ShapingProxy(endpoint, latency_s=LATENCY_S, bandwidth_bps=BANDWIDTH_BPS) as proxy:
        cache = DatasetCache(disk_dir=cache_dirs[0], memory_dir=cache_dirs[1], memory_bytes=16 << 20)
        ds = cache.open("s3set", "s3://data/set", opts(proxy.url))
        assert list(ds.keys) == sorted(objects)
        assert proxy.requests["GET"] >= 1  # the listing went through the proxy, not around it
        listed = sum(proxy.requests.values())

        small = [i for i, k in enumerate(ds.keys) if not k.startswith("big/")]
        t0 = time.monotonic()
        for i in small[:4]:
            assert ds.read(i) == objects[ds.keys[i]]
        # four sequential misses, each a GET that waited the injected latency first
        assert time.monotonic() - t0 >= 4 * LATENCY_S

        big = ds.keys.index("big/blob.bin")
        t0 = time.monotonic()
        assert ds.read(big) == objects["big/blob.bin"]
        assert time.monotonic() - t0 >= LATENCY_S + 200_000 / BANDWIDTH_BPS * 0.9  # paced, not loopback speed

        assert all(ds.read(i) == objects[k] for i, k in enumerate(ds.keys))
        assert ds.counters.misses == len(objects)
        # one GET per object through the proxy, each answered by moto
        assert {p: n for p, n in proxy.paths.items() if p.startswith("/data/set/")} == {
            f"/data/set/{k}": 1 for k in objects
        }
        seen = sum(proxy.requests.values())
        assert seen - listed == len(objects)

        # warm reads never reach the proxy
        assert all(ds.read(i) == objects[k] for i, k in enumerate(ds.keys))
        assert sum(proxy.requests.values()) == seen


def test_proxy_forwards_writes_and_errors(moto) -> None:
    endpoint, _ = moto
    with ShapingProxy(endpoint, latency_s=0.01) as proxy:
        src = Source("s3://data/set", opts(proxy.url), retries=0)
        src.put("new/item.bin", b"written through the proxy")
        assert Source("s3://data/set", opts(endpoint)).fetch("new/item.bin") == b"written through the proxy"
        assert proxy.requests["PUT"] >= 1
        from sluice.data.errors import SourceError

        with pytest.raises(SourceError, match="not found"):
            src.fetch("c0/missing.bin")
