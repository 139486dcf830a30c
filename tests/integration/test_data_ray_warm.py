"""`sluice dataset warm` on a real multi-node Ray cluster: every node's agent actor fills its
own node cache from a loopback HTTP source.

The cluster (ray.cluster_utils.Cluster: a head and two workers, 1 CPU each) lives on this
machine, so each Ray node is given its own cache folders through its raylet's environment
(SLUICE_CACHE_DISK_DIR / SLUICE_CACHE_MEMORY_DIR), as separate machines would have. The test
then looks into each node's folders: the files are there because that node's agent put them.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from sluice.control.datasets import DatasetService, cache_folder  # noqa: E402
from sluice.data.guard import SourceGuard  # noqa: E402
from sluice.data.httpserve import DataServer  # noqa: E402
from sluice.engine.ray import RayEngine  # noqa: E402
from sluice.settings import Settings  # noqa: E402
from sluice.spec import DatasetSpec, SpecError  # noqa: E402
from sluice.store.memory import MemoryStore  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.ray, pytest.mark.timeout(180)]

OBJECT_STORE = 80 * 1024 * 1024
NODES = ("w0", "w1", "w2")


@dataclass
class Caller:
    name: str = "default"
    admin: bool = False


@dataclass
class WarmCluster:
    cluster: Cluster
    shared: Path
    tiers: dict[str, list[Path]]
    """sluice node label -> that node's cache folders (disk tier, memory tier)."""


def node_env(tmp: Path, mem_tag: str, node: str) -> dict[str, str]:
    return {
        "SLUICE_CACHE_DISK_DIR": str(tmp / node / "cache"),
        "SLUICE_CACHE_MEMORY_DIR": f"/dev/shm/sluice-test-{mem_tag}-{node}",
        "SLUICE_CACHE_MEMORY_BYTES": str(16 << 20),
    }


@pytest.fixture
def warm_cluster(tmp_path: Path) -> Iterator[WarmCluster]:
    mem_tag = uuid.uuid4().hex[:8]
    envs = {n: node_env(tmp_path, mem_tag, n) for n in NODES}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "object_store_memory": OBJECT_STORE,
            "include_dashboard": False,
            "labels": {"sluice.node": NODES[0]},
            "env_vars": envs[NODES[0]],
        },
    )
    try:
        for n in NODES[1:]:
            cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE, labels={"sluice.node": n}, env_vars=envs[n])
        cluster.wait_for_nodes()
        tiers = {n: [Path(envs[n]["SLUICE_CACHE_DISK_DIR"]), Path(envs[n]["SLUICE_CACHE_MEMORY_DIR"])] for n in NODES}
        yield WarmCluster(cluster, tmp_path / "shared", tiers)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        for env in envs.values():
            shutil.rmtree(env["SLUICE_CACHE_MEMORY_DIR"], ignore_errors=True)


def cached_files(cache_dirs: list[Path], ds: str) -> dict[str, str]:
    """Relative key -> sha1 of every item file a node holds for dataset folder `ds`."""
    out: dict[str, str] = {}
    for root in cache_dirs:
        base = root / ds
        if base.is_dir():
            for p in base.rglob("*"):
                if p.is_file() and not p.name.startswith(".sluice"):
                    out[p.relative_to(base).as_posix()] = hashlib.sha1(p.read_bytes()).hexdigest()
    return out


def test_warm_fills_every_ray_nodes_cache_and_rm_empties_it_through_each_agent(
    warm_cluster: WarmCluster, tmp_path: Path
) -> None:
    src = tmp_path / "imgs"
    want: dict[str, str] = {}
    for i in range(24):
        key = f"c{i % 3}/{i:03d}.jpg"
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        body = bytes([i]) * (500 + 37 * i)
        (src / key).write_bytes(body)
        want[key] = hashlib.sha1(body).hexdigest()
    # The admin allow-lists the test's loopback server, for the plane and (through the agent
    # settings) every node's agent; tests/security shows loopback is refused without it.
    allow = ["127.0.0.1"]
    engine = RayEngine(
        Settings(allow_source_hosts=allow), shared_root=warm_cluster.shared, address=warm_cluster.cluster.address
    )
    try:
        nodes = [n.name for n in engine.nodes()]
        assert len(nodes) == 3
        label = {n.name: n.labels.get("sluice.node") for n in engine.nodes()}
        with DataServer(src) as srv:
            svc = DatasetService(MemoryStore(), engine=engine, guard=SourceGuard.of([], allow))
            assert svc.warmer is engine
            rec = svc.create(Caller(), DatasetSpec(name="imgs", source=srv.url))
            ds = cache_folder(rec)  # the folder jobs open: owner/name, source and generation

            # only the named node
            [one] = svc.warm(Caller(), "imgs", nodes=[nodes[1]])
            assert one.node == nodes[1] and one.error is None and one.files_fetched == 24
            with pytest.raises(SpecError, match="nodes"):
                svc.warm(Caller(), "imgs", nodes=["no-such-node"])

            # every node: each one's agent fetches into its own folders (the named one is warm)
            first = {r.node: r for r in svc.warm(Caller(), "imgs")}
            assert set(first) == set(nodes)
            for n, r in first.items():
                assert r.error is None, r.error
                assert r.cached_fraction == 1.0
                assert r.files_fetched + r.already_cached == 24
                assert r.files_fetched == (0 if n == nodes[1] else 24)
                assert r.bytes_fetched == (0 if n == nodes[1] else rec.total_bytes)
                assert cached_files(warm_cluster.tiers[label[n]], ds) == want
            gets_after_first = sum(srv.requests.values())

            # a second warm finds everything in place and fetches nothing
            second = svc.warm(Caller(), "imgs")
            assert all(r.error is None and r.files_fetched == 0 and r.already_cached == 24 for r in second)
            assert sum(srv.requests.values()) == gets_after_first

            # deleting the dataset drops it from every node's cache, through each agent
            purged = svc.delete(Caller(), "imgs")
            assert purged == {n: "removed" for n in nodes}
            for n in nodes:
                assert cached_files(warm_cluster.tiers[label[n]], ds) == {}
    finally:
        engine.close()
