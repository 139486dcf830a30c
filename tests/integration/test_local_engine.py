"""LocalEngine end to end: virtual nodes on real cpusets, bad requests as exits, a real example."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sluice.agent.cgroup import CgroupKind
from sluice.engine.base import Engine
from sluice.engine.local import LocalEngine
from sluice.model import Allocation, Event, JobCheckpointed, JobExited, JobProgress, LaunchRequest
from sluice.settings import Settings
from sluice.spec import JobSpec, load_job_spec
from tests.integration.conftest import JOBS, wait_for

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def engine2(sluice_settings: Settings) -> Iterator[LocalEngine]:
    e = LocalEngine(sluice_settings.model_copy(update={"virtual_nodes": 2}))
    yield e
    e.close()


def _drain_until_exit(engine: LocalEngine, job_id: str, timeout: float = 120.0) -> list[Event]:
    seen: list[Event] = []

    def exited() -> bool:
        seen.extend(engine.poll())
        return any(isinstance(e, JobExited) and e.job_id == job_id for e in seen)

    assert wait_for(exited, timeout=timeout, every=0.1), f"{job_id} did not exit; log: {engine.log_path(job_id)}"
    return seen


def test_virtual_nodes_split_the_cores_and_keep_jobs_on_theirs(engine2: LocalEngine, tmp_path: Path) -> None:
    assert isinstance(engine2, Engine)
    nodes = {n.name: n for n in engine2.nodes()}
    if len(psutil.Process().cpu_affinity() or []) < 2:
        pytest.skip("needs at least 2 cores to split")
    assert set(nodes) == {"node-0", "node-1"}
    assert nodes["node-1"].cpu == pytest.approx(len(psutil.Process().cpu_affinity() or []) / 2)
    last_core = int(nodes["node-1"].labels["cores"].split(",")[-1])

    spec = JobSpec(command=["python", str(JOBS / "sdk_loop.py"), "--sleep", "0.05"], workdir=str(tmp_path))
    engine2.launch(LaunchRequest("vn", 1, "t", spec, Allocation.single("node-1", 0.5, 0.5), str(tmp_path / "ck")))
    agent = engine2.agents["node-1"]
    assert wait_for(lambda: agent.child_pid("vn", 1) is not None)
    child = psutil.Process(agent.child_pid("vn", 1))
    cores = child.cpu_affinity() or []
    assert set(cores) <= {int(c) for c in nodes["node-1"].labels["cores"].split(",")} and last_core in cores
    assert engine2.alive() == {"vn": 1}
    engine2.resize("vn", 1, Allocation.single("node-1", 1.0, 0.75))
    seen: list[Event] = []
    # stop once the job runs its loop (a SIGTERM before the SDK is imported just kills it)
    assert wait_for(lambda: any(isinstance(e, JobProgress) for e in seen) or bool(seen.extend(engine2.poll())))
    engine2.stop("vn", 1, checkpoint=True)
    exit_event = next(e for e in _drain_until_exit(engine2, "vn") if isinstance(e, JobExited))
    assert exit_event.exit_code == 0
    log = engine2.log_path("vn")
    assert log is not None and "on node-1" in Path(log).read_text()


def test_a_job_cannot_widen_its_cpu_affinity_past_its_virtual_node(engine2: LocalEngine, tmp_path: Path) -> None:
    """An attack: the job asks the kernel for every core. A node's cpuset (v1: the node's
    group; v2: the job's own) keeps it on its node's; affinity alone (how v2 hosts ran virtual
    nodes before) let it take the machine."""
    agent = engine2.agents["node-0"]
    if agent.layout.kind is CgroupKind.AFFINITY:
        pytest.skip(f"no cgroup cpu controller here: {agent.layout.reason}")
    if agent.cpuset is None and not agent.layout.cpuset_v2:
        pytest.skip("no writable cpuset controller here")
    code = "import os; os.sched_setaffinity(0, range(os.cpu_count())); print('cores', sorted(os.sched_getaffinity(0)))"
    spec = JobSpec(command=["python", "-c", code], workdir=str(tmp_path))
    engine2.launch(LaunchRequest("wide", 1, "t", spec, Allocation.single("node-0", 0.5, 0.5), str(tmp_path / "ck")))
    exit_event = next(e for e in _drain_until_exit(engine2, "wide") if isinstance(e, JobExited))
    log = Path(engine2.log_path("wide") or "").read_text()
    assert exit_event.exit_code == 0, log
    line = next(ln for ln in log.splitlines() if ln.startswith("cores "))
    mine = sorted(agent.cpus)
    assert line == f"cores {mine}", (line, mine)


def test_bad_requests_come_back_as_exits_not_exceptions(engine2: LocalEngine, tmp_path: Path) -> None:
    missing = JobSpec(command=["python", "train.py"], workdir=str(tmp_path / "gone"))
    engine2.launch(LaunchRequest("wd", 1, "t", missing, Allocation.single("node-0"), str(tmp_path / "ck")))
    engine2.launch(
        LaunchRequest("nonode", 1, "t", JobSpec(command=["true"]), Allocation.single("node-9"), str(tmp_path))
    )
    events = [e for e in engine2.poll() if isinstance(e, JobExited)]
    reasons = {e.job_id: (e.exit_code, e.reason) for e in events}
    assert reasons["wd"][0] == 127 and "workdir" in reasons["wd"][1]
    assert reasons["nonode"][0] == 127 and "node-9" in reasons["nonode"][1]
    with pytest.raises(LookupError):
        engine2.resize("wd", 1, Allocation.single("node-0"))


def test_a_real_example_trains_checkpoints_and_exits_zero(sluice_settings: Settings, tmp_path: Path) -> None:
    engine = LocalEngine(sluice_settings)
    try:
        spec = load_job_spec(EXAMPLES / "mlp.yaml")
        spec = spec.model_copy(update={"command": [*spec.command, "--steps", "150"]})
        node = engine.nodes()[0].name
        engine.launch(LaunchRequest("mlp", 1, "t", spec, Allocation.single(node, 1.0, 1.0), str(tmp_path / "ck")))
        events = _drain_until_exit(engine, "mlp", timeout=240)
    finally:
        engine.close()
    exited = next(e for e in events if isinstance(e, JobExited))
    assert exited.exit_code == 0, Path(engine.log_path("mlp") or "").read_text()
    progress = [e for e in events if isinstance(e, JobProgress)]
    assert progress[-1].step == 149 and progress[-1].metrics["total_steps"] == 150
    assert progress[0].loss is not None and progress[-1].loss is not None
    assert progress[-1].loss < 0.5 * progress[0].loss, "the loss falls"
    ckpt = [e for e in events if isinstance(e, JobCheckpointed)]
    assert ckpt and ckpt[-1].step == 149 and Path(ckpt[-1].path).is_file()
