"""The node cache against real sources: an HTTP server on loopback (with latency and injected
faults), S3 in moto's server mode, several reader processes at once, and a writer killed with
SIGKILL halfway through writing an item."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.data.cache import DISK, MEMORY, DatasetCache
from sluice.data.errors import SourceError, UnsafePath
from sluice.data.httpserve import DataServer
from sluice.data.manifest import MANIFEST_NAME

pytestmark = pytest.mark.integration


def make_files(root: Path, n: int, seed: int = 0, lo: int = 1000, hi: int = 20000) -> dict[str, str]:
    """n random files in a few folders; returns key -> sha1 and writes the source's manifest."""
    rng = random.Random(seed)
    digests: dict[str, str] = {}
    items = []
    for i in range(n):
        key = f"c{i % 3}/img{i:05d}.bin"
        data = rng.randbytes(rng.randint(lo, hi))
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
        digests[key] = hashlib.sha1(data).hexdigest()
        items.append([key, len(data)])
    items.sort()
    (root / MANIFEST_NAME).write_text(json.dumps({"version": 1, "items": items}))
    return digests


@pytest.fixture
def src(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root = tmp_path / "src"
    root.mkdir()
    return root, make_files(root, 120)


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[str, str]]:
    mem = f"/dev/shm/sluice-test-{uuid.uuid4().hex[:8]}"
    yield str(tmp_path / "disk"), mem
    shutil.rmtree(mem, ignore_errors=True)


@pytest.fixture
def server(src: tuple[Path, dict[str, str]]) -> Iterator[DataServer]:
    with DataServer(src[0], latency_s=0.002) as srv:
        yield srv


def test_reads_through_the_tiers_and_a_second_reader_hits_memory(server: DataServer, src, dirs) -> None:
    _, digests = src
    cache = DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1], memory_bytes=64 << 20)
    ds = cache.open("toy", server.url)
    assert len(ds) == len(digests)
    for i, key in enumerate(ds.keys):
        assert hashlib.sha1(ds.read(i)).hexdigest() == digests[key]
    assert ds.counters.misses == len(digests)
    fetched = sum(server.requests[k] for k in digests)
    again = DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1]).open("toy", server.url)
    for i in range(len(again)):
        again.read(i)
    assert again.counters.hits_memory == len(digests) and again.counters.misses == 0
    assert sum(server.requests[k] for k in digests) == fetched
    frac, _free = cache.state()
    assert frac == {"toy": 1.0}
    view = again.view(3)
    assert bytes(view) == again.read(3)


def test_cost_aware_eviction_keeps_hot_items_and_demotes_to_disk(server: DataServer, src, dirs) -> None:
    cache = DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1], memory_bytes=200_000)
    ds = cache.open("toy", server.url)
    hot = list(range(5))
    for _ in range(20):
        for i in hot:
            ds.read(i)
    ds.flush()
    for i in range(5, len(ds)):
        ds.read(i)
    ds.flush()
    in_memory = {key for _, key, _, _, _ in cache.index.entries(ds.ds, MEMORY)}
    on_disk = {key for _, key, _, _, _ in cache.index.entries(ds.ds, DISK)}
    assert {ds.keys[i] for i in hot} <= in_memory
    assert len(in_memory) < len(ds)
    assert set(ds.keys) - in_memory <= on_disk  # demoted, not lost
    used, cap = cache.index.usage()[MEMORY]
    assert used <= cap
    assert sum(os.path.getsize(os.path.join(dirs[1], ds.ds, k)) for k in in_memory) == used


READER = textwrap.dedent(
    """
    import hashlib, json, random, sys
    from sluice.data.cache import DatasetCache
    disk, mem, url, seed = sys.argv[1:5]
    ds = DatasetCache(disk_dir=disk, memory_dir=mem).open("toy", url)
    order = list(range(len(ds)))
    random.Random(int(seed)).shuffle(order)
    out = {ds.keys[i]: hashlib.sha1(ds.read(i)).hexdigest() for i in order}
    print(json.dumps({"digests": out, "misses": ds.counters.misses}))
    """
)


def test_concurrent_reader_processes_fetch_each_item_once(server: DataServer, src, dirs) -> None:
    _, digests = src
    DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1], memory_bytes=64 << 20).open("toy", server.url)
    procs = [
        subprocess.Popen([sys.executable, "-c", READER, dirs[0], dirs[1], server.url, str(s)], stdout=subprocess.PIPE)
        for s in range(4)
    ]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        results.append(json.loads(out))
    for r in results:
        assert r["digests"] == digests
    assert sum(r["misses"] for r in results) == len(digests)
    assert all(server.requests[k] == 1 for k in digests), "an item was fetched twice on one node"


WRITER = textwrap.dedent(
    """
    import os, sys, time
    import sluice.data.files as files
    from sluice.data.cache import DatasetCache
    disk, mem, url = sys.argv[1:4]
    real_write = os.write
    def half_then_hang(fd, data):
        n = real_write(fd, bytes(data)[: len(data) // 2])
        print("HALF", flush=True)
        time.sleep(3600)
        return n
    files.os.write = half_then_hang
    DatasetCache(disk_dir=disk, memory_dir=mem).open("toy", url).read(0)
    """
)


def test_writer_killed_mid_write_leaves_no_torn_item(server: DataServer, src, dirs) -> None:
    _, digests = src
    cache = DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1], memory_bytes=64 << 20)
    ds = cache.open("toy", server.url)
    p = subprocess.Popen([sys.executable, "-c", WRITER, *dirs, server.url], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "HALF"
        final = Path(dirs[1], ds.ds, ds.keys[0])
        temps = [f for f in final.parent.iterdir() if ".sluice-tmp." in f.name]
        assert len(temps) == 1 and temps[0].stat().st_size < ds.sizes[0]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert not final.exists()
    report = DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1]).recover()
    assert report.temp_files_removed == 1
    assert hashlib.sha1(ds.read(0)).hexdigest() == digests[ds.keys[0]]
    ds.flush()  # commit the index entry (batched in the background otherwise)
    # A damaged item under the final name (same size, flipped byte) is caught by a verifying recovery.
    path = Path(dirs[1], ds.ds, ds.keys[0])
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0xFF
    path.write_bytes(bytes(raw))
    report = DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1]).recover(verify=True)
    assert report.entries_dropped == 1 and not path.exists()
    # A truncated one is refused on the read path itself and fetched again.
    ds.read(1)
    p1 = Path(dirs[1], ds.ds, ds.keys[1])
    p1.write_bytes(p1.read_bytes()[:10])
    assert hashlib.sha1(ds.read(1)).hexdigest() == digests[ds.keys[1]]
    assert ds.counters.corrupt_dropped == 1


def test_source_failing_mid_read_retries_then_fails_clearly_and_caches_nothing(server: DataServer, src, dirs) -> None:
    _, digests = src
    cache = DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1], memory_bytes=64 << 20)
    cache.settings.retry_backoff_s = 0.01
    ds = cache.open("toy", server.url)
    ds.source.backoff_s = 0.01
    server.cut_after(ds.keys[0], 100, times=1)
    assert hashlib.sha1(ds.read(0)).hexdigest() == digests[ds.keys[0]]
    server.cut_after(ds.keys[1], 100, times=1000)
    with pytest.raises(SourceError) as err:
        ds.read(1)
    msg = str(err.value)
    assert "toy/" + ds.keys[1] in msg and server.url in msg and "attempts" in msg
    assert not Path(dirs[1], ds.ds, ds.keys[1]).exists()
    assert not [f for f in Path(dirs[1], ds.ds, ds.keys[1]).parent.iterdir() if ".sluice-tmp." in f.name]
    assert cache.index.get(ds.ds, ds.keys[1], MEMORY) is None
    server.cut_after(ds.keys[1], 0, times=0)
    assert hashlib.sha1(ds.read(1)).hexdigest() == digests[ds.keys[1]]


def test_dataset_paths_cannot_escape(tmp_path: Path, dirs) -> None:
    root = tmp_path / "evil"
    (root / "ok").mkdir(parents=True)
    (root / "ok" / "a.bin").write_bytes(b"x" * 10)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    os.symlink(secret, root / "ok" / "leak.bin")
    cache = DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1], memory_bytes=1 << 20)
    with pytest.raises(UnsafePath, match="outside the dataset source"):
        cache.open("evil", str(root))
    os.unlink(root / "ok" / "leak.bin")
    for bad in ("../../outside.bin", "/etc/passwd"):
        (root / MANIFEST_NAME).write_text(json.dumps({"items": [[bad, 10]]}))
        with pytest.raises(UnsafePath):
            cache.open("evil", str(root), refresh=True)
    (root / MANIFEST_NAME).unlink()
    ds = cache.open("evil", str(root), refresh=True)
    assert ds.read(0) == b"x" * 10
    # a symlinked folder planted in the memory tier is not followed
    shutil.rmtree(Path(dirs[1], ds.ds, "ok"))
    os.symlink(tmp_path, Path(dirs[1], ds.ds, "ok"))
    fresh = DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1]).open("evil", str(root))
    with pytest.raises(UnsafePath):
        fresh.read(0)


def test_s3_source_in_moto_server(moto_s3: tuple[str, Any], dirs) -> None:
    endpoint, s3 = moto_s3
    rng = random.Random(1)
    want = {}
    for i in range(30):
        body = rng.randbytes(rng.randint(100, 5000))
        s3.put_object(Bucket="data", Key=f"set/x{i:03d}.bin", Body=body)
        want[f"x{i:03d}.bin"] = body
    opts = {"endpoint_url": endpoint, "key": "k", "secret": "s"}
    cache = DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1], memory_bytes=1 << 20)
    ds = cache.open("s3set", "s3://data/set", opts)
    assert list(ds.keys) == sorted(want)
    assert all(ds.read(i) == want[k] for i, k in enumerate(ds.keys))
    assert ds.counters.misses == 30


def test_sdk_dataset_with_dataloader_workers_reports_stall(server: DataServer, src, dirs, monkeypatch) -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    from sluice.sdk.dataset import data_metrics, dataset

    monkeypatch.setenv("SLUICE_DATASETS", json.dumps({"toy": {"source": server.url}}))
    monkeypatch.setenv("SLUICE_CACHE_DISK_DIR", dirs[0])
    monkeypatch.setenv("SLUICE_CACHE_MEMORY_DIR", dirs[1])
    _, digests = src
    ds = dataset("toy", decode=lambda b: hashlib.sha1(b).hexdigest())
    loader = torch_data.DataLoader(ds, batch_size=16, sampler=ds.sampler(seed=1), num_workers=2)
    got = sorted(h for batch in loader for h in batch)
    assert got == sorted(digests.values())
    assert ds[0] == digests[ds.handle.reader().cached.keys[0]]
    assert "stall_s" in data_metrics() and data_metrics()["stall_s"] >= 0
    # per-dataset cache counters for /metrics (this process read ds[0]: one hit or miss at least)
    cache = {k: v for k, v in data_metrics().items() if k.startswith("cache:toy:")}
    assert set(cache) == {"cache:toy:hits_memory", "cache:toy:hits_disk", "cache:toy:misses"}
    assert sum(cache.values()) >= 1
    stream = dataset("toy", streaming=True, merge=64 * 1024)
    items = list(torch_data.DataLoader(stream, batch_size=None, num_workers=2))
    assert sorted(hashlib.sha1(bytes(b)).hexdigest() for b in items) == sorted(digests.values())
    with pytest.raises(ValueError, match="not mounted"):
        dataset("nope")


def test_online_merging_then_cold_reads_fetch_blocks(server: DataServer, src, dirs, tmp_path: Path) -> None:
    root, digests = src
    cache = DatasetCache(disk_dir=dirs[0], memory_dir=dirs[1], memory_bytes=64 << 20)
    local = cache.open("toy-local", str(root))
    lay = local.layout(128 * 1024)
    assert lay.count < len(local) // 4
    local.publish_blocks(lay)  # a local source is writable: blocks go next to the files
    mem2 = dirs[1] + "-cold"
    try:
        cold = DatasetCache(disk_dir=str(tmp_path / "disk2"), memory_dir=mem2, memory_bytes=64 << 20)
        ds = cold.open("toy", server.url)
        from sluice.data.reader import Reader

        before = sum(server.requests.values())
        reader = Reader(ds, merge=128 * 1024)
        got = [hashlib.sha1(bytes(b)).hexdigest() for b in reader.epoch(seed=4)]
        assert sorted(got) == sorted(digests.values())
        assert sum(server.requests.values()) - before <= lay.count + 2  # one request per block
        assert reader.metrics()["merge_block_bytes"] == 128 * 1024
    finally:
        shutil.rmtree(mem2, ignore_errors=True)
