"""On Ray, a node's jobs get the GPUs Ray gave that node, not 0..n-1 (a real Ray cluster of
three raylets on this machine; no GPU here, so each raylet declares its GPUs with
`--num-gpus`, as `ray start` on a machine whose GPUs it cannot see would).

An operator keeps GPUs 0 and 1 of a machine for other work by starting its raylet under
`CUDA_VISIBLE_DEVICES=2,3`: Ray counts two GPUs there and gives its own tasks GPUs 2 and 3.
sluice's agent handed out "0" and "1", the operator's. The agent actor holds no GPU of Ray's,
and Ray may empty such an actor's own CUDA_VISIBLE_DEVICES (older Ray releases always did;
newer ones where RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1, node g1 here): the agent reads its
raylet's.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from sluice.engine.ray import RayEngine  # noqa: E402
from sluice.model import Allocation, Assignment, JobExited, LaunchRequest  # noqa: E402
from sluice.spec import JobSpec  # noqa: E402
from tests.conftest import passable  # noqa: E402
from tests.integration.conftest import wait_for  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.ray, pytest.mark.timeout(240)]

OBJECT_STORE = 80 * 1024 * 1024
PRINT_GPUS = "import os; print('GPUS=' + os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>'))"

NODES = {
    # sluice node name: (GPUs the raylet declares, the raylet's environment, ids its jobs must get)
    "g0": (2, {"CUDA_VISIBLE_DEVICES": "2,3"}, ["2", "3"]),
    "g1": (2, {"CUDA_VISIBLE_DEVICES": "1,3", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}, ["1", "3"]),
    "g2": (1, {}, ["0"]),  # no CUDA_VISIBLE_DEVICES: Ray's own numbering
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayEngine]:
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:  # Ray checks --num-gpus against this process's
        pytest.skip("CUDA_VISIBLE_DEVICES is set for the test process; Ray would check the nodes' GPUs against it")
    shared = tmp_path_factory.mktemp("ray-gpus")
    if os.geteuid() == 0:  # jobs run as tenant uids (docs/security.md): the shared root is passable
        passable(shared, tmp_path_factory.getbasetemp().parent)

    def node_args(name: str) -> dict[str, object]:
        gpus, env, _ = NODES[name]
        return {
            "num_cpus": 1,
            "num_gpus": gpus,
            "object_store_memory": OBJECT_STORE,
            "labels": {"sluice.node": name},
            "env_vars": env,
        }

    cluster = Cluster(initialize_head=True, head_node_args={**node_args("g0"), "include_dashboard": False})
    try:
        for name in ("g1", "g2"):
            cluster.add_node(**node_args(name))
        cluster.wait_for_nodes()
        eng = RayEngine(shared_root=shared, address=cluster.address)
        try:
            assert wait_for(lambda: {n.name for n in eng.nodes()} == set(NODES), 60), eng.nodes()
            yield eng
        finally:
            eng.close()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def _gpus_a_job_sees(engine: RayEngine, node: str, gpus: int, tmp_path: Path) -> str:
    spec = JobSpec(command=[sys.executable, "-c", PRINT_GPUS], workdir=str(tmp_path))
    job = f"see-{node}"
    alloc = Allocation((Assignment(node, 1.0, None, gpus=gpus),))
    engine.launch(LaunchRequest(job, 1, "t1", spec, alloc, str(tmp_path / "ckpt" / job)))
    deadline = time.monotonic() + 90
    while True:
        exits = [e for e in engine.poll() if isinstance(e, JobExited) and e.job_id == job]
        if exits:
            break
        assert time.monotonic() < deadline, f"the job on {node} did not exit"
        time.sleep(0.2)
    assert exits[0].exit_code == 0, exits
    log = engine.log_path(job)
    assert log is not None
    lines = [ln for ln in Path(log).read_text().splitlines() if ln.startswith("GPUS=")]
    assert lines, Path(log).read_text()
    return lines[-1][len("GPUS=") :]


@pytest.mark.parametrize("node", sorted(NODES))
def test_a_job_on_a_ray_node_sees_the_gpus_ray_gave_that_node(engine: RayEngine, node: str, tmp_path: Path) -> None:
    declared, _env, want = NODES[node]
    assert {n.name: n.gpus for n in engine.nodes()}[node] == declared  # what placement sees
    assert _gpus_a_job_sees(engine, node, declared, tmp_path).split(",") == want
