"""`sluice bench data`: the data path against its baselines, side by side, in one run.

1. warm node cache vs the same bytes read straight from local tmpfs (the physical limit);
2. warm node cache vs the remote source with a per-request latency (default 20 ms);
3. merged blocks vs single small files, cold, from the remote source (and what `auto` picks);
4. two jobs on one node reading the same dataset for several epochs: shared node cache vs no cache;
5. a compute-bound training loop: cost of the whole data path vs data already in memory;
6. placement in the simulator (the production Controller and real policies over the `sim`
   engine with node dataset caches): local data hit rate and JCT, data-aware vs binpack.

The remote source is a real server on loopback with the latency added by sluice (this machine
has no netem): by default sluice's HTTP file server (sluice.data.httpserve), or with
`remote="s3"` moto in server mode behind sluice's shaping proxy (sluice.data.s3proxy).
Remote contenders read a subset of the small-file set (so one run stays within minutes at
20 ms a request); every ratio printed compares equal work.
"""

from __future__ import annotations

import functools
import itertools
import json
import multiprocessing as mp
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table

from sluice.data.blocks import Layout
from sluice.data.cache import DatasetCache
from sluice.data.httpserve import DataServer
from sluice.data.manifest import MANIFEST_NAME
from sluice.data.reader import Reader
from sluice.data.s3proxy import ShapingProxy
from sluice.data.source import Source

if TYPE_CHECKING:
    from sluice.control.simulate import SimResult

console = Console()
MB = 1024 * 1024


@dataclass
class Row:
    scenario: str
    contender: str
    baseline: str
    value: float
    base_value: float
    unit: str
    goal: str
    higher_is_better: bool = True

    @property
    def ratio(self) -> float:
        if self.higher_is_better:
            return self.value / self.base_value if self.base_value else float("inf")
        return self.base_value / self.value if self.value else float("inf")


# -- datasets -------------------------------------------------------------------------------
def make_small_files(root: Path, n: int, seed: int = 0, lo: int = 3 * 1024, hi: int = 100 * 1024) -> None:
    """n incompressible 'images' of lo..hi bytes in 100 class folders, plus the source manifest."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(lo, hi + 1, size=n)
    blob = rng.integers(0, 256, size=int(sizes.max()) * 4, dtype=np.uint8).tobytes()
    items = []
    for i, s in enumerate(sizes):
        key = f"class{i % 100:03d}/img{i:06d}.jpg"
        off = int(rng.integers(0, len(blob) - int(s)))
        p = root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(i.to_bytes(4, "little") + blob[off : off + int(s) - 4])
        items.append([key, int(s)])
    items.sort()
    (root / MANIFEST_NAME).write_text(json.dumps({"version": 1, "items": items}))


def work_base() -> Path:
    """Where the bench makes its files: tmpfs (memory) where there is one."""
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


SMALL_FILE_MAX_BYTES = 100 * 1024
"""The largest of `make_small_files`' files (3 to 100 KiB)."""


def bytes_needed(files: int, large_files: int, large_mb: int) -> int:
    """At most what the data scenarios write under `work_base()`: the sources and up to two
    copies of them (a node cache's, and the merged blocks or a second tier's)."""
    return 3 * (files * SMALL_FILE_MAX_BYTES + large_files * large_mb * MB)


def make_large_files(root: Path, n: int, size: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        key = f"shard{i:03d}.bin"
        (root / key).write_bytes(rng.integers(0, 256, size=size, dtype=np.uint8).tobytes())
        items.append([key, size])
    (root / MANIFEST_NAME).write_text(json.dumps({"version": 1, "items": items}))


def subset(src: Path, dst: Path, n: int) -> None:
    """The first n files of a small-file set, as a dataset of its own."""
    items = json.loads((src / MANIFEST_NAME).read_text())["items"][:n]
    for key, _ in items:
        (dst / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / key, dst / key)
    (dst / MANIFEST_NAME).write_text(json.dumps({"version": 1, "items": items}))


# -- the remote source -------------------------------------------------------------------------
REMOTES = ("http", "s3")


@dataclass
class RemoteSource:
    """Where the remote contenders read from: an fsspec URL and its storage options."""

    kind: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)
    describe: str = ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_server(timeout_s: float = 60.0) -> Iterator[str]:
    """moto's S3 server in a process of its own (not a thread of the benchmark, whose readers
    would then compete with it for the GIL); yields its endpoint URL."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=5).close()
                break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on {endpoint}") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


S3_CREDENTIALS = {"key": "bench", "secret": "bench", "client_kwargs": {"region_name": "us-east-1"}}


def upload_tree(endpoint: str, root: Path, bucket: str, prefix: str, workers: int = 8) -> int:
    """Put every file under `root` into s3://bucket/prefix/ (what the S3 contenders read)."""
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_CREDENTIALS["key"],
        aws_secret_access_key=S3_CREDENTIALS["secret"],
        region_name="us-east-1",
    )
    s3.create_bucket(Bucket=bucket)
    files = [p for p in root.rglob("*") if p.is_file()]
    with ThreadPoolExecutor(workers) as pool:
        list(
            pool.map(
                lambda p: s3.put_object(
                    Bucket=bucket, Key=f"{prefix}/{p.relative_to(root).as_posix()}", Body=p.read_bytes()
                ),
                files,
            )
        )
    return len(files)


@contextmanager
def remote_source(kind: str, root: Path, latency_s: float) -> Iterator[RemoteSource]:
    """The files under `root` served on loopback with `latency_s` added to every request."""
    if kind == "http":
        with DataServer(root, latency_s=latency_s) as srv:
            yield RemoteSource("http", srv.url, {}, f"sluice's HTTP file server {srv.url}")
    elif kind == "s3":
        with moto_server() as endpoint:
            n = upload_tree(endpoint, root, "bench", "sub")
            with ShapingProxy(endpoint, latency_s=latency_s) as proxy:
                yield RemoteSource(
                    "s3",
                    "s3://bench/sub",
                    {"endpoint_url": proxy.url, **S3_CREDENTIALS},
                    f"moto S3 server {endpoint} ({n} objects) behind the shaping proxy {proxy.url}",
                )
    else:
        raise ValueError(f"remote: unknown remote {kind!r}; choose one of {', '.join(REMOTES)}")


# -- helpers --------------------------------------------------------------------------------
def read_plain(path: str, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, size + 1)
    finally:
        os.close(fd)


def best_of(n: int, fn: Callable[[], float]) -> float:
    """Best (shortest) of n runs of fn, which returns seconds: the least disturbed measurement."""
    return min(fn() for _ in range(n))


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cache_at(work: Path, tag: str, memory_bytes: int = 8 * 1024 * MB) -> DatasetCache:
    return DatasetCache(disk_dir=work / f"disk-{tag}", memory_dir=work / f"mem-{tag}", memory_bytes=memory_bytes)


# -- 1 and 2: warm cache vs tmpfs, vs remote -----------------------------------------------
def scenario_warm(
    work: Path, small: Path, large: Path, remote_src: RemoteSource, remote_n: int, workers: int
) -> list[Row]:
    rows: list[Row] = []
    cache = cache_at(work, "warm")
    for label, src in (("small files", small), ("large files", large)):
        cd = cache.open(label.replace(" ", "-"), str(src))
        cd.warm(workers)
        n = len(cd)
        order = list(range(n))
        random.Random(0).shuffle(order)
        paths = [str(src / k) for k in cd.keys]
        total = cd.manifest.total_bytes

        def plain(order: list[int] = order, paths: list[str] = paths, sizes: tuple[int, ...] = cd.sizes) -> None:
            for i in order:
                read_plain(paths[i], sizes[i])

        def cached(order: list[int] = order, cd: Any = cd) -> None:
            for i in order:
                cd.read(i)

        t_plain = best_of(5, functools.partial(timed, plain))
        t_cache = best_of(5, functools.partial(timed, cached))
        rows.append(
            Row(
                f"1 warm cache vs local tmpfs ({label}, {n} files)",
                "node cache read()",
                "tmpfs open+read",
                total / t_cache / MB,
                total / t_plain / MB,
                "MiB/s",
                ">= 0.90x",
            )
        )
    # 2: remote, 20 ms a request, the same parallelism for both
    cd = cache.open("small-files", str(small))
    n = min(remote_n, len(cd))
    order = list(range(n))
    remote = Source(remote_src.url, remote_src.options)
    keys, sizes = cd.keys, cd.sizes
    nbytes = sum(sizes[:n])

    def from_remote() -> None:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda i: remote.fetch(keys[i], sizes[i]), order))

    t_remote = timed(from_remote)
    t_cache = best_of(3, lambda: timed(lambda: [cd.read(i) for i in order]))
    rows.append(
        Row(
            f"2 warm cache vs remote ({n} small files)",
            "node cache (warm)",
            f"remote ({remote_src.kind}), {workers} parallel requests",
            nbytes / t_cache / MB,
            nbytes / t_remote / MB,
            "MiB/s",
            ">= 10x",
        )
    )
    return rows


# -- 3: merged vs unmerged, cold, from the remote ------------------------------------------
def publish_blocks(work: Path, sub: Path, block_bytes: int) -> tuple[Layout, int, int]:
    """Merge the remote subset into blocks next to its files — what online merging leaves next
    to a writable source — before the remote serves it. Returns (layout, files, bytes)."""
    local = cache_at(work, "merge-prep").open("sub-local", str(sub))
    lay = local.layout(block_bytes)
    local.publish_blocks(lay)
    return lay, len(local), local.manifest.total_bytes


def scenario_merge(
    work: Path, remote: RemoteSource, block_bytes: int, published: tuple[Layout, int, int]
) -> tuple[list[Row], str]:
    lay, n, total = published

    def cold(tag: str, merge: str | int) -> tuple[float, Reader]:
        cd = cache_at(work, f"merge-{tag}").open("sub", remote.url, remote.options)
        reader = Reader(cd, merge=merge, probe_items=128)
        t = timed(lambda: sum(1 for _ in reader.epoch(seed=1)))
        return t, reader

    t_plain, _ = cold("off", "off")
    t_merged, _ = cold("on", block_bytes)
    t_auto, auto = cold("auto", "auto")
    rows = [
        Row(
            f"3 merged vs unmerged, cold from remote ({remote.kind}, {n} files, {lay.count} blocks)",
            f"merged {block_bytes // MB} MiB blocks",
            "one request per file",
            total / t_merged / MB,
            total / t_plain / MB,
            "MiB/s",
            ">= 2x",
        ),
        Row(
            f"3 merged vs unmerged, cold from remote ({remote.kind}, {n} files, {lay.count} blocks)",
            "auto (probe, then decide)",
            "one request per file",
            total / t_auto / MB,
            total / t_plain / MB,
            "MiB/s",
            "> 1x",
        ),
    ]
    return rows, auto.tuner.reason


# -- 4: two jobs on one node ------------------------------------------------------------------
def epoch_order(n: int, job: int, epoch: int) -> list[int]:
    """The order one job reads the dataset in one epoch: its own shuffle, new every epoch."""
    order = list(range(n))
    random.Random(job * 1_000_003 + epoch).shuffle(order)
    return order


def _job(
    mode: str,
    url: str,
    opts: dict[str, Any],
    work: str,
    job: int,
    epochs: int,
    workers: int,
    ready: Any,
    start: Any,
    done: Any,
) -> None:
    """One 'job' process: gets ready (imports, manifest), waits for the common start, reads the
    whole dataset `epochs` times, each epoch in its own shuffled order, with `workers` reads in
    flight, and reports the wall-clock time it finished.

    Both modes run this same loop; the only difference is what one read is: `cache` reads
    through the node cache the two jobs share (a miss fetches from the remote in the reading
    thread, once per node), `nocache` fetches from the remote every time."""
    if mode == "cache":
        cache = DatasetCache(disk_dir=Path(work) / "disk-two", memory_dir=Path(work) / "mem-two")
        cd = cache.open("two", url, opts)
        n, read = len(cd), cd.read
    else:
        src = Source(url, opts)
        manifest = src.list()
        keys, sizes = manifest.keys, manifest.sizes
        n = len(manifest)

        def read(i: int) -> bytes:
            return src.fetch(keys[i], sizes[i])

    ready.put(1)
    start.wait()
    with ThreadPoolExecutor(workers) as pool:
        for e in range(epochs):
            for _ in pool.map(read, epoch_order(n, job, e)):
                pass
    done.put(time.time())


def scenario_two_jobs(work: Path, remote: RemoteSource, workers: int, epochs: int) -> list[Row]:
    DatasetCache(disk_dir=work / "disk-two", memory_dir=work / "mem-two", memory_bytes=8 * 1024 * MB)
    ctx = mp.get_context("spawn")
    out = {}
    for mode in ("nocache", "cache"):
        ready, done, start = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs = [
            ctx.Process(
                target=_job,
                args=(mode, remote.url, remote.options, str(work), job, epochs, workers, ready, start, done),
            )
            for job in (1, 2)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=300)
        t0 = time.time()
        start.set()
        finished = [done.get(timeout=3600) for _ in procs]
        for p in procs:
            p.join(60)
        out[mode] = max(finished) - t0
    return [
        Row(
            f"4 two jobs, one node, same dataset, {epochs} epochs each, own shuffle (wall time, both jobs)",
            "shared node cache",
            f"no cache (each job fetches, {workers} in flight)",
            out["cache"],
            out["nocache"],
            "s",
            ">= 2x",
            higher_is_better=False,
        )
    ]


# -- 5: compute-bound job ---------------------------------------------------------------------
def scenario_compute_bound(work: Path, small: Path, items: int) -> list[Row]:
    import torch

    torch.set_num_threads(1)
    # The job's dataset is exactly the items both sides train on, warm in the node cache (one
    # untimed pass), so the comparison is the data path's cost, not cache misses: reading a
    # random 4,096 of the 20,000-file set through a cache warmed for other items made the
    # path side mostly misses (+50-120 % when the scenario ran alone).
    src = work / "src-compute"
    src.mkdir(exist_ok=True)
    subset(small, src, items)
    cache = cache_at(work, "compute")
    cd = cache.open("compute-set", str(src))
    n = len(cd)
    in_memory = [cd.read(i) for i in range(n)]
    model = torch.nn.Sequential(torch.nn.Linear(768, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: list[bytes]) -> None:
        x = torch.stack([torch.frombuffer(bytearray(b[:768]), dtype=torch.uint8).float() / 255 for b in batch])
        for _ in range(8):  # make compute dominate, as in a real model
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    def train(source: Any) -> float:
        t0 = time.perf_counter()
        batch: list[bytes] = []
        for item in source:
            batch.append(item)
            if len(batch) == 32:
                step(batch)
                batch = []
        return time.perf_counter() - t0

    plain_t, path_t = [], []
    for r in range(7):
        order = list(range(n))
        random.Random(r).shuffle(order)
        plain_t.append(train(in_memory[i] for i in order))
        reader = Reader(cd, merge="auto", probe_items=256)
        path_t.append(train(itertools.islice(reader.epoch(seed=r), n)))  # the same number of items
    base, ours = statistics.median(plain_t), statistics.median(path_t)
    return [
        Row(
            f"5 compute-bound training ({n} items, median of 7)",
            "through the data path (prefetch, stats, auto)",
            "items already in memory",
            ours,
            base,
            "s",
            "overhead <= 3 %",
            higher_is_better=False,
        )
    ]


# -- 6: placement simulation ------------------------------------------------------------------
PLACEMENT_INTERVAL_S = 10.0
"""Seconds between scheduling rounds in scenario 6 (jobs run for thousands of seconds)."""


def placement_run(policy: str, seed: int = 0, n_nodes: int = 16, n_jobs: int = 400) -> SimResult:
    """Scenario 6 through the one simulator: the production Controller and the real policy over
    the `sim` engine, whose nodes keep dataset caches (600 GB each, LRU of whole datasets) and
    report them as a node agent does; `data_workload`'s jobs read ~120 GB datasets of Zipf
    popularity for several epochs, loading overlapped with compute (see sluice.sim.datacache)."""
    from sluice.control.simulate import DataCluster, SimConfig, data_workload, run_simulation

    jobs, sizes = data_workload(n_jobs, seed=seed)
    cfg = SimConfig(
        nodes=n_nodes, gpus_per_node=0, cpus_per_node=16.0, interval_s=PLACEMENT_INTERVAL_S, data=DataCluster(sizes)
    )
    return run_simulation(jobs, policy, cfg)


def scenario_placement(seed: int, nodes: int, jobs: int) -> list[Row]:
    res = {p: placement_run(p, seed=seed, n_nodes=nodes, n_jobs=jobs) for p in ("binpack", "data-aware")}
    b, d = res["binpack"], res["data-aware"]
    return [
        Row(
            f"6 simulated cluster ({nodes} nodes, {jobs} jobs): local data hit rate",
            "data-aware",
            "binpack",
            (d.local_read_share or 0.0) * 100,
            (b.local_read_share or 0.0) * 100,
            "%",
            "Kang: up to +16.5 %",
        ),
        Row(
            f"6 simulated cluster ({nodes} nodes, {jobs} jobs): mean JCT",
            "data-aware",
            "binpack",
            d.avg_jct_s,
            b.avg_jct_s,
            "s",
            "lower",
            higher_is_better=False,
        ),
    ]


# -- the command ------------------------------------------------------------------------------
def print_rows(rows: list[Row]) -> None:
    t = Table("scenario", "contender", "baseline", "contender", "baseline", "ratio", "goal", header_style="bold")
    for r in rows:
        if r.unit == "%":
            gain = f"{r.value - r.base_value:+.1f} pts"
        elif r.scenario.startswith("5"):
            gain = f"overhead {(r.value / r.base_value - 1) * 100:+.1f} %"
        else:
            gain = f"{r.ratio:.2f}x"
        t.add_row(
            r.scenario,
            r.contender,
            r.baseline,
            f"{r.value:,.2f} {r.unit}",
            f"{r.base_value:,.2f} {r.unit}",
            gain,
            r.goal,
        )
    console.print(t)


def run(
    files: int = 20_000,
    remote_files: int = 2_000,
    latency_ms: float = 20.0,
    large_files: int = 8,
    large_mb: int = 64,
    workers: int = 16,
    block_mb: int = 4,
    sim_nodes: int = 16,
    sim_jobs: int = 400,
    scenarios: str = "1,2,3,4,5,6",
    out: Path | None = None,
    two_jobs_epochs: int = 3,
    remote: str = "http",
) -> list[Row]:
    if remote not in REMOTES:
        raise ValueError(f"remote: unknown remote {remote!r}; choose one of {', '.join(REMOTES)}")
    if two_jobs_epochs < 1:
        raise ValueError(f"two_jobs_epochs: must be at least 1, got {two_jobs_epochs}")
    want = {s.strip() for s in scenarios.split(",")}
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-data-", dir=work_base()))
    rows: list[Row] = []
    notes: list[str] = []
    try:
        if want & {"1", "2", "3", "4", "5"}:  # scenario 6 is a simulation: it needs no files
            small, large, sub = work / "src-small", work / "src-large", work / "src-sub"
            for p in (small, large, sub):
                p.mkdir()
            with console.status(f"generating {files} small files and {large_files} x {large_mb} MiB files on tmpfs"):
                make_small_files(small, files)
                make_large_files(large, large_files, large_mb * MB)
                subset(small, sub, remote_files)
            published = publish_blocks(work, sub, block_mb * MB) if "3" in want else None
            with remote_source(remote, sub, latency_ms / 1000) as src:
                console.print(f"remote source: {src.describe} ({latency_ms:g} ms per request), {remote_files} files")
                if want & {"1", "2"}:
                    with console.status("1-2 warm cache vs tmpfs and vs remote"):
                        rows += scenario_warm(work, small, large, src, remote_files, workers)
                if published is not None:
                    with console.status("3 merged vs unmerged, cold"):
                        r3, reason = scenario_merge(work, src, block_mb * MB, published)
                        rows += r3
                        notes.append(f"auto merging: {reason or 'still probing when the epoch ended'}")
                if "4" in want:
                    with console.status(f"4 two jobs on one node, {two_jobs_epochs} epochs each"):
                        rows += scenario_two_jobs(work, src, workers, two_jobs_epochs)
            if "5" in want:
                with console.status("5 compute-bound job"):
                    rows += scenario_compute_bound(work, small, 4096)
        if "6" in want:
            with console.status("6 placement simulation"):
                rows += scenario_placement(0, sim_nodes, sim_jobs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_rows(rows)
    for n in notes:
        console.print(n, markup=False)
    console.print(f"machine: {os.cpu_count()} CPUs; tmpfs at {work_base()}", markup=False)
    if out is not None:
        out.write_text(json.dumps([r.__dict__ | {"ratio": r.ratio} for r in rows], indent=2))
    return rows
