"""One control plane per Ray namespace (engine/ray_claim.py), on a one-node Ray cluster."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from sluice.engine.ray import RayEngine  # noqa: E402
from sluice.engine.ray_claim import NamespaceInUse, plane_id  # noqa: E402
from sluice.settings import Settings  # noqa: E402
from tests.integration.conftest import remove_cgroups  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.ray, pytest.mark.timeout(180)]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False},
    )
    try:
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def test_a_second_plane_is_refused_the_namespace_and_the_same_plane_takes_it_over(
    cluster: Cluster, tmp_path: Path
) -> None:
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    shared = tmp_path / "shared"
    root_a = f"sluice-claim-{uuid.uuid4().hex[:8]}"  # a's node names would clash with b's under one root
    try:
        _claims(home_a, home_b, root_a, shared, cluster, tmp_path)
    finally:
        remove_cgroups(root_a)


def _claims(home_a: Path, home_b: Path, root_a: str, shared: Path, cluster: Cluster, tmp_path: Path) -> None:
    a = RayEngine(Settings(home=home_a, cgroup_root=root_a), shared_root=shared, address=cluster.address)
    assert plane_id(home_a) == plane_id(home_a) != plane_id(home_b)
    owner = ray.get(ray.get_actor("sluice-plane", namespace="sluice").get.remote())
    assert owner["plane_id"] == plane_id(home_a) and owner["home"] == str(home_a.resolve())
    with pytest.raises(NamespaceInUse, match=r"ray_namespace .*SLUICE_RAY_NAMESPACE"):
        RayEngine(Settings(home=home_b), shared_root=shared, address=cluster.address)
    a.close()  # the refusal disconnected this process (one plane, one engine); a's run is over

    # The same plane again (sluice down / up, or a restart after kill -9): it takes over.
    a2 = RayEngine(Settings(home=home_a, cgroup_root=root_a), shared_root=shared, address=cluster.address)
    assert [n.name for n in a2.nodes()]
    a2.close()  # releases the namespace

    # Another plane, once the owner is gone, gets it; and a plane of its own namespace always does.
    b = RayEngine(Settings(home=home_b), shared_root=shared, address=cluster.address)
    try:
        with pytest.raises(NamespaceInUse):
            RayEngine(Settings(home=home_a), shared_root=shared, address=cluster.address)
    finally:
        b.close()
    deadline = time.monotonic() + 30
    while True:  # b's driver is gone: Ray ends its liveness actor
        try:
            c = RayEngine(Settings(home=tmp_path / "c"), shared_root=shared, address=cluster.address)
            break
        except NamespaceInUse:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    c.close()
    other = RayEngine(Settings(home=home_a, ray_namespace="sluice-a"), shared_root=shared, address=cluster.address)
    other.close()
