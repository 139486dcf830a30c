"""The Ray engine on a real multi-node Ray cluster on this machine (ray.cluster_utils.Cluster).

One cluster (a head and three workers, 1 CPU each, labelled n0..n3) is shared by the tests
of this module; jobs are real processes started by each node's agent actor. The "nodes" all
live on this machine, so a test can read the cgroup files of a remote node's job — but the
agent in that node's actor is the one that wrote them.

Losing a node: `Cluster.remove_node` kills the node's raylet; every job's shim on that node
has the raylet as its guard (see sluice/agent/shim.py) and SIGKILLs its job, as a dead
machine would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from sluice.api import job_logs  # noqa: E402
from sluice.control.controller import Controller  # noqa: E402
from sluice.engine.ray import RayEngine  # noqa: E402
from sluice.model import (  # noqa: E402
    Allocation,
    Assignment,
    ClusterView,
    Decision,
    Migrate,
    NodeHealth,
    Phase,
    Place,
    Preempt,
    Resize,
)
from sluice.policy.kube import KubePolicy  # noqa: E402
from sluice.spec import JobSpec  # noqa: E402
from sluice.store.memory import MemoryStore  # noqa: E402
from tests.conftest import passable  # noqa: E402
from tests.integration.conftest import process_gone, wait_for  # noqa: E402
from tests.ray_timing import FAST_NODE_DEATH  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.ray, pytest.mark.timeout(240)]

OBJECT_STORE = 80 * 1024 * 1024
WORKERS = ("n1", "n2", "n3")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

TOY_JOB = '''
"""Toy training job: resumes from its newest checkpoint, checkpoints every interval and on SIGTERM.
Appends "<attempt> <step> <time>" per step to steps.log among its checkpoints (the job's own
folder: under tenant isolation the one above it is the plane's)."""
import json, os, pathlib, signal, sys, time

run = pathlib.Path(os.environ["SLUICE_RUN_DIR"])
ck = pathlib.Path(os.environ["SLUICE_CHECKPOINT_DIR"])
ck.mkdir(parents=True, exist_ok=True)
attempt = os.environ["SLUICE_ATTEMPT"]
total, dt = int(sys.argv[1]), float(sys.argv[2])
interval = float(os.environ.get("SLUICE_CHECKPOINT_INTERVAL_S", "1"))
stop = False

def on_term(*_):
    global stop
    stop = True

signal.signal(signal.SIGTERM, on_term)
done = sorted(ck.glob("ckpt-*.json"))
start = json.loads(done[-1].read_text())["step"] if done else 0
prog = open(run / "progress.jsonl", "a")
ledger = open(ck / "steps.log", "a")

def report(rec):
    prog.write(json.dumps(rec) + "\\n")
    prog.flush()

def save(step):
    path = ck / f"ckpt-{step:08d}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step}))
    os.replace(tmp, path)
    report({"t": time.time(), "step": step, "checkpoint": str(path)})

last = time.time()
for step in range(start + 1, total + 1):
    time.sleep(dt)
    ledger.write(f"{attempt} {step} {time.time()}\\n")
    ledger.flush()
    report({"t": time.time(), "step": step, "loss": 1.0 / (1 + step / 10), "metrics": {"total_steps": total}})
    if stop:
        save(step)
        sys.exit(0)
    if time.time() - last >= interval:
        save(step)
        last = time.time()
'''


DDP_JOB = '''
"""Two-replica PyTorch DDP over gloo on CPU; each rank writes its final weights' sum."""
import json, os, pathlib, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE come from the engine
rank = dist.get_rank()
torch.manual_seed(rank)  # different data per rank; DDP keeps the weights identical
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
run = pathlib.Path(os.environ["SLUICE_RUN_DIR"])
for step in range(1, 31):
    x = torch.randn(32, 8)
    loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0:
        with open(run / "progress.jsonl", "a") as f:
            f.write(json.dumps({"t": time.time(), "step": step, "loss": loss.item()}) + "\\n")
total = sum(p.detach().sum().item() for p in model.parameters())
out = pathlib.Path(os.environ["SLUICE_CHECKPOINT_DIR"]).parent / f"rank{rank}.json"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({"rank": rank, "world": dist.get_world_size(), "sum": total,
                           "node": os.environ["SLUICE_NODE"], "master": os.environ["MASTER_ADDR"]}))
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # no interpreter shutdown under gloo's worker thread (see examples/ddp.py's leave())
'''


@dataclass
class RayTestCluster:
    cluster: Cluster
    shared: Path
    job_script: Path
    nodes: dict[str, Any] = field(default_factory=dict)
    """sluice node name -> ray._private.node.Node (for remove_node and raylet pids)."""

    def add(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(
            num_cpus=1, object_store_memory=OBJECT_STORE, labels={"sluice.node": name}
        )
        self.cluster.wait_for_nodes()

    def lose(self, name: str) -> None:
        """Lose a node: its raylet dies (and with it, through their shims' guard, its job processes)."""
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)

    def raylet_pid(self, name: str) -> int:
        return int(self.nodes[name].all_processes["raylet"][0].process.pid)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayTestCluster]:
    shared = tmp_path_factory.mktemp("ray-shared")
    if os.geteuid() == 0:  # jobs run as tenant uids (docs/security.md): the shared root is passable
        passable(shared, tmp_path_factory.getbasetemp().parent)
    script = shared / "toy_job.py"
    script.write_text(TOY_JOB)
    (shared / "ddp_job.py").write_text(DDP_JOB)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "object_store_memory": OBJECT_STORE,
            "include_dashboard": False,
            "labels": {"sluice.node": "n0"},
            "_system_config": FAST_NODE_DEATH,
        },
    )
    rc = RayTestCluster(cluster, shared, script)
    rc.nodes["n0"] = cluster.head_node
    try:
        for name in WORKERS:
            rc.add(name)
        yield rc
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


class Scripted(KubePolicy):
    """kube placement, plus the placements, migrations and resizes the test asks for (a real
    policy: a function of the view)."""

    def __init__(self) -> None:
        self.moves: dict[str, str] = {}
        self.preempts: set[str] = set()
        self.places: dict[str, Allocation] = {}
        """job id -> where to place it when queued (instead of kube's choice)."""
        self.resizes: dict[str, tuple[int, Allocation]] = {}
        """job id -> (step, allocation): resize it once it runs past that step."""

    def decide(self, view: ClusterView) -> list[Decision]:
        out = [d for d in super().decide(view) if getattr(d, "job_id", None) not in self.places]
        for job in view.queued:
            if job.id in self.places:
                out.append(Place(job.id, self.places.pop(job.id), "test places it"))
        for job_id, (step, alloc) in list(self.resizes.items()):
            job = view.jobs.get(job_id)
            if job is not None and job.phase == Phase.RUNNING and job.progress.step >= step:
                del self.resizes[job_id]
                out.append(Resize(job_id, alloc, f"test: {alloc.replicas} replica(s)"))
        for job_id in list(self.preempts):
            job = view.jobs.get(job_id)
            if job is not None and job.phase == Phase.RUNNING:
                self.preempts.discard(job_id)
                out.append(Preempt(job_id, "test asks to preempt it for a higher-priority job"))
        for job_id, node in list(self.moves.items()):
            job = view.jobs.get(job_id)
            if job is not None and job.phase == Phase.RUNNING and job.allocation is not None:
                del self.moves[job_id]
                out.append(Migrate(job_id, Allocation.single(node, 1.0), f"test asks to move it to {node}"))
        return out


@pytest.fixture()
def plane(ray_cluster: RayTestCluster) -> Iterator[tuple[Controller, RayEngine, Scripted]]:
    engine = RayEngine(shared_root=ray_cluster.shared, address=ray_cluster.cluster.address)
    policy = Scripted()
    ctl = Controller(MemoryStore(), engine, policy, checkpoint_root=engine.checkpoint_root, restart_backoff_s=0.2)
    try:
        yield ctl, engine, policy
    finally:
        for job in ctl.book.live():
            ctl.cancel(job.id, "test teardown")
        try:
            run_until(ctl, lambda: not ctl.book.live(), 60)
        finally:
            engine.close()


def run_until(ctl: Controller, done: Callable[[], bool], limit_s: float) -> None:
    """Reconcile until `done()`; the limit only keeps a broken run from hanging the suite."""
    deadline = time.monotonic() + limit_s
    while not done():
        if time.monotonic() > deadline:
            phases = {j.id: f"{j.phase} ({j.reason})" for j in ctl.book.query()}
            raise AssertionError(f"condition not reached; jobs: {phases}")
        ctl.step()
        time.sleep(0.2)


def toy(ray_cluster: RayTestCluster, steps: int, step_s: float, interval_s: float = 1.0, name: str = "toy") -> JobSpec:
    return JobSpec(
        name=name,
        command=["python", str(ray_cluster.job_script), str(steps), str(step_s)],
        checkpoint={"interval_s": interval_s},
    )


def steps_log(engine: RayEngine, job_id: str) -> list[tuple[int, int, float]]:
    path = Path(engine.checkpoint_root) / job_id / "checkpoints" / "steps.log"
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(a), int(s), float(t)) for a, s, t in rows]


def attempt_dir(ray_cluster: RayTestCluster, node: str, job_id: str, attempt: int) -> Path:
    return ray_cluster.shared / "runs" / "nodes" / node / job_id / f"attempt-{attempt}"


def cpu_limit_cores(pid: int) -> float | None:
    """The CFS limit (cores) of the process's own cgroup: v1 `cpu.cfs_quota_us`, else v2 `cpu.max`."""
    lines = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    for _, controllers, path in lines:
        if "cpu" in controllers.split(","):
            d = Path("/sys/fs/cgroup/cpu") / path.lstrip("/")
            quota = int((d / "cpu.cfs_quota_us").read_text())
            return None if quota < 0 else quota / int((d / "cpu.cfs_period_us").read_text())
    for hid, _, path in lines:
        for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
            f = mount / path.lstrip("/") / "cpu.max"
            if hid == "0" and f.exists():
                quota_s, period_s = f.read_text().split()
                return None if quota_s == "max" else int(quota_s) / int(period_s)
    raise AssertionError(f"process {pid} is in no cpu cgroup")


def cgroups_writable() -> bool:
    """Asked at collection, under a probe root of its own, removed at once (with no root it made
    the default root's groups, `sluice`, on the machine)."""
    from sluice.agent.cgroup import CgroupKind, detect_cgroups, remove_root

    root = f"sluice-probe-{os.getpid()}"
    try:
        return detect_cgroups(root=root).kind != CgroupKind.AFFINITY
    finally:
        remove_root(root)


def node_of(ctl: Controller, job_id: str) -> str:
    alloc = ctl.book.get(job_id).allocation
    assert alloc is not None
    return alloc.primary_node


# --------------------------------------------------------------------------------------- tests


def test_agents_are_pinned_one_per_ray_node(plane: tuple[Controller, RayEngine, Scripted]) -> None:
    ctl, engine, _ = plane
    names = sorted(n.name for n in engine.nodes())
    assert names == ["n0", "n1", "n2", "n3"]
    for name in names:
        node_id = engine.ray_node_id(name)
        actor = ray.get_actor(f"sluice-agent-{node_id}", namespace="sluice")
        assert ray.get(actor.info.remote()).name == name
    assert {n.name for n in ctl.view().nodes.values()} == set(names)
    # What only the agents know (whether a node can enforce memory_mb) reaches the node's labels,
    # in the engine's list and in the controller's view, so the plane can refuse at submit.
    run_until(ctl, lambda: all("memory-limits" in (ctl.node(n).labels or {}) for n in names), 30)  # type: ignore[union-attr]
    kinds = {n.name: n.labels.get("memory-limits") for n in engine.nodes()}
    assert set(kinds) == set(names) and all(k in ("cgroup-v1", "cgroup-v2", "none") for k in kinds.values()), kinds


@pytest.mark.skipif(not cgroups_writable(), reason="no writable cgroup cpu controller: limits fall back to affinity")
def test_jobs_spread_over_nodes_and_cpu_limit_changes_live_on_a_remote_node(
    ray_cluster: RayTestCluster, plane: tuple[Controller, RayEngine, Scripted]
) -> None:
    ctl, engine, _ = plane
    jobs = [ctl.submit("t", toy(ray_cluster, 400, 0.05, name=f"spread{i}")).id for i in range(4)]
    run_until(ctl, lambda: all(ctl.book.get(j).phase == Phase.RUNNING for j in jobs), 90)
    placed = {node_of(ctl, j) for j in jobs}
    assert placed == {"n0", "n1", "n2", "n3"}  # kube spreads: one 1-CPU job per 1-CPU node
    assert engine.still_running([*jobs, "j-0000000000"]) == sorted(jobs)  # every node's agent asked

    job = next(j for j in jobs if node_of(ctl, j) == "n2")
    adir = attempt_dir(ray_cluster, "n2", job, 1)
    run_until(ctl, lambda: (adir / "child.json").exists(), 30)
    child = int(json.loads((adir / "child.json").read_text())["pid"])
    shim = int(json.loads((adir / "state.json").read_text())["shim_pid"])
    # the process was started by n2's agent actor, a worker of n2's raylet
    import psutil

    worker = psutil.Process(shim).ppid()
    assert psutil.Process(worker).ppid() == ray_cluster.raylet_pid("n2")
    assert cpu_limit_cores(child) is None  # kube: shares only, no ceiling

    engine.resize(job, 1, Allocation.single("n2", 1.0, 0.3))
    assert cpu_limit_cores(child) == pytest.approx(0.3)  # the same process, limited in place
    engine.resize(job, 1, Allocation.single("n2", 1.0, 0.75))
    assert cpu_limit_cores(child) == pytest.approx(0.75)
    assert psutil.pid_exists(child)


def test_a_fault_is_injected_on_the_named_ray_node_by_its_agent_and_stops_by_itself(
    ray_cluster: RayTestCluster, plane: tuple[Controller, RayEngine, Scripted]
) -> None:
    import psutil

    _, engine, _ = plane
    report = engine.inject_fault("n1", "cpu", 2.0, workers=1)
    assert report.node == "n1" and report.kind == "cpu" and report.pids
    worker = psutil.Process(report.pids[0]).ppid()  # started by n1's agent actor...
    assert psutil.Process(worker).ppid() == ray_cluster.raylet_pid("n1")  # ...a worker of n1's raylet

    stopped = wait_for(lambda: all(process_gone(p) for p in report.pids), 20)
    assert stopped, "the fault did not stop after its duration"
    with pytest.raises(KeyError):
        engine.inject_fault("no-such-node", "cpu", 1.0)


def test_migration_resumes_on_another_node_from_the_checkpoint(
    ray_cluster: RayTestCluster, plane: tuple[Controller, RayEngine, Scripted]
) -> None:
    ctl, engine, policy = plane
    job = ctl.submit("t", toy(ray_cluster, 240, 0.05, interval_s=0.5, name="mover")).id
    run_until(ctl, lambda: ctl.book.get(job).phase == Phase.RUNNING and ctl.book.get(job).step >= 30, 60)
    src = node_of(ctl, job)
    dst = next(n for n in ("n1", "n2", "n3", "n0") if n != src)
    policy.moves[job] = dst
    run_until(ctl, lambda: ctl.book.get(job).attempt == 2 and ctl.book.get(job).phase == Phase.RUNNING, 60)
    assert node_of(ctl, job) == dst
    moved_at = ctl.book.get(job).step
    # ... and back to the first node: its log then holds attempts 1 and 3, the other's 2.
    run_until(ctl, lambda: ctl.book.get(job).step >= moved_at + 30, 60)
    policy.moves[job] = src
    run_until(ctl, lambda: ctl.book.get(job).attempt == 3 and ctl.book.get(job).phase == Phase.RUNNING, 60)
    assert node_of(ctl, job) == src
    run_until(ctl, lambda: ctl.book.get(job).phase.terminal, 90)
    assert ctl.book.get(job).phase == Phase.SUCCEEDED

    rows = steps_log(engine, job)
    first, second, third = ([s for a, s, _ in rows if a == k] for k in (1, 2, 3))
    assert first[0] == 1 and first[-1] >= 30
    # SIGTERM made each attempt checkpoint its last step; the next continues right after it
    assert second[0] == first[-1] + 1 and third[0] == second[-1] + 1
    assert third[-1] == 240
    assert max(t for a, _, t in rows if a == 1) < min(t for a, _, t in rows if a == 2)
    hints = engine.job_hints(job)
    assert hints["ray_node"] == src and hints["last_move_s"] > 0
    # Attempt 2's log stays on its node's folder; attempts 1 and 3 share the first node's.
    earlier = engine.earlier_logs(job)
    assert len(earlier) == 1 and f"/nodes/{dst}/" in earlier[0], earlier
    current = engine.log_path(job)
    assert current is not None and current not in earlier and f"/nodes/{src}/" in current
    # `job logs` reads them cut at each attempt's start (the agents' index), in attempt order:
    # whole files, oldest write first, gave 2, then 1 and 3.
    parts = job_logs.segments(job_logs.by_attempt([Path(p) for p in [*earlier, current]]), None)
    text = b"".join(job_logs.pieces(parts)).decode()
    heads = [text.index(f"attempt {k} of {job}") for k in (1, 2, 3)]
    assert heads == sorted(heads), text[:2000]
    assert text.count(f"attempt 1 of {job}") == 1


def test_preempted_job_yields_its_node_and_resumes_from_its_checkpoint_on_another(
    ray_cluster: RayTestCluster, plane: tuple[Controller, RayEngine, Scripted]
) -> None:
    """The cluster is full (four 1-CPU nodes, four jobs); a high-priority job arrives and the
    policy preempts a low-priority one. The urgent job takes the freed node; the preempted
    job waits in the queue and resumes from its checkpoint on the node that frees up next."""
    ctl, engine, policy = plane
    long_ = [ctl.submit("t", toy(ray_cluster, 400, 0.05, 0.5, name=f"long{i}")).id for i in range(2)]
    victim = ctl.submit("t", toy(ray_cluster, 200, 0.05, 0.5, name="victim")).id
    short = ctl.submit("t", toy(ray_cluster, 100, 0.05, 0.5, name="short")).id
    everyone = [*long_, victim, short]
    run_until(
        ctl, lambda: all(ctl.book.get(j).phase == Phase.RUNNING and ctl.book.get(j).step >= 20 for j in everyone), 90
    )
    assert len({node_of(ctl, j) for j in everyone}) == 4  # one per node: the cluster is full
    victim_node, short_node = node_of(ctl, victim), node_of(ctl, short)

    policy.preempts.add(victim)
    # long enough to hold the victim's node until the short job has finished elsewhere
    urgent = ctl.submit("t", toy(ray_cluster, 400, 0.05, 0.5, name="urgent").model_copy(update={"priority": 10})).id
    run_until(ctl, lambda: ctl.book.get(urgent).phase in (Phase.RUNNING, Phase.SUCCEEDED), 60)
    assert node_of_last_place(ctl, urgent) == victim_node
    run_until(ctl, lambda: ctl.book.get(victim).phase.terminal, 120)

    assert ctl.book.get(victim).phase == Phase.SUCCEEDED
    assert ctl.book.get(short).phase == Phase.SUCCEEDED  # the victim could only resume once a node freed up
    assert node_of_last_place(ctl, victim) == short_node != victim_node
    rows = steps_log(engine, victim)
    first = [s for a, s, _ in rows if a == 1]
    second = [s for a, s, _ in rows if a == 2]
    assert first[-1] < 200  # stopped mid-run
    assert second[0] == first[-1] + 1  # SIGTERM made it checkpoint its last step; nothing redone
    assert second[-1] == 200
    assert max(t for a, _, t in rows if a == 1) < min(t for a, _, t in rows if a == 2)
    # the time the move took is recorded for the job
    assert (ctl.book.get(victim).last_stop_s or 0) > 0
    assert engine.job_hints(victim)["last_move_s"] > 0


def test_node_loss_requeues_its_jobs_elsewhere_and_the_node_is_used_again(
    ray_cluster: RayTestCluster, plane: tuple[Controller, RayEngine, Scripted]
) -> None:
    ctl, engine, _ = plane
    interval = 0.5
    step_s = 0.05
    # Long enough (15 s of steps) that the victim is surely mid-run when its node goes, even
    # when a loaded machine makes the controller's view of progress lag by seconds.
    total = 300
    jobs = [ctl.submit("t", toy(ray_cluster, total, step_s, interval, name=f"survivor{i}")).id for i in range(3)]
    run_until(ctl, lambda: all(ctl.book.get(j).phase == Phase.RUNNING and ctl.book.get(j).step >= 20 for j in jobs), 90)
    victim_node = next(node_of(ctl, j) for j in jobs if node_of(ctl, j) != "n0")
    victims = [j for j in jobs if node_of(ctl, j) == victim_node]
    lost_at = time.time()
    ray_cluster.lose(victim_node)
    run_until(ctl, lambda: ctl.node(victim_node).health == NodeHealth.LOST, 60)
    run_until(ctl, lambda: all(ctl.book.get(j).phase.terminal for j in jobs), 120)

    assert all(ctl.book.get(j).phase == Phase.SUCCEEDED for j in jobs)  # none lost
    for j in victims:
        rows = steps_log(engine, j)
        attempts = sorted({a for a, _, _ in rows})
        assert attempts == [1, 2], "\n".join(e.message for e in ctl.store.events(job_id=j) if e.kind != "checkpoint")
        old = [(s, t) for a, s, t in rows if a == 1]
        new = [(s, t) for a, s, t in rows if a == 2]
        # none ran twice: the old attempt stopped before the new one began
        assert max(t for _, t in old) < min(t for _, t in new)
        # lost work: steps done again are at most one checkpoint interval's worth
        redone = old[-1][0] - new[0][0] + 1
        assert 0 <= redone <= int(interval / step_s) + 2
        assert old[-1][0] < total  # it was lost mid-run, not after it had finished
        # it died with its node (its shim's guard), not when Ray declared the node dead
        assert old[-1][1] < lost_at + 3.0, f"the lost node's job ran {old[-1][1] - lost_at:.1f}s after the loss"
        assert new[-1][0] == total
        assert node_of_last_place(ctl, j) != victim_node

    ray_cluster.add(victim_node)
    run_until(ctl, lambda: ctl.node(victim_node).health == NodeHealth.HEALTHY, 60)
    more = [ctl.submit("t", toy(ray_cluster, 20, 0.05, name=f"again{i}")).id for i in range(4)]
    run_until(ctl, lambda: all(ctl.book.get(j).phase != Phase.QUEUED and ctl.book.get(j).attempt > 0 for j in more), 60)
    assert victim_node in {node_of_last_place(ctl, j) for j in more}
    run_until(ctl, lambda: all(ctl.book.get(j).phase.terminal for j in more), 60)
    assert all(ctl.book.get(j).phase == Phase.SUCCEEDED for j in more)


def node_of_last_place(ctl: Controller, job_id: str) -> str:
    places = [e for e in ctl.store.events(job_id=job_id) if e.kind == "place"]
    assert places, f"{job_id} was never placed"
    data = places[-1].data or {}
    return str(data["allocation"][0]["node"])


def test_gang_places_all_replicas_and_runs_ddp_over_gloo_across_nodes(
    ray_cluster: RayTestCluster, plane: tuple[Controller, RayEngine, Scripted]
) -> None:
    pytest.importorskip("torch")
    ctl, engine, _ = plane
    spec = JobSpec(
        name="ddp",
        command=["python", str(ray_cluster.shared / "ddp_job.py")],
        resources={"cpu": 1, "replicas": {"min": 2}},
    )
    job = ctl.submit("t", spec).id
    run_until(ctl, lambda: ctl.book.get(job).phase.terminal, 120)
    assert ctl.book.get(job).phase == Phase.SUCCEEDED, ctl.book.get(job).reason
    places = [e for e in ctl.store.events(job_id=job) if e.kind == "place"]
    nodes = [a["node"] for a in places[-1].data["allocation"]]
    assert len(nodes) == 2 and len(set(nodes)) == 2  # one replica per 1-CPU node, placed together
    ranks = [json.loads((Path(engine.checkpoint_root) / job / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["node"] for r in ranks] == nodes
    assert all(r["world"] == 2 for r in ranks)
    assert ranks[0]["sum"] == pytest.approx(ranks[1]["sum"], abs=1e-6)  # all-reduced: same weights
    assert ctl.book.get(job).step == 30  # rank 0's reports reached the controller as the job's
    # Each replica's log stays on its node; `job logs --replica K` reads it (rank 0's is the job's).
    logs = [engine.replica_log(job, k) for k in (0, 1)]
    assert logs[0] is not None and logs[1] is not None and logs[0] != logs[1]
    assert f"/nodes/{nodes[1]}/{job}--r1of2/" in logs[1] and Path(logs[1]).read_text().strip(), logs
    assert engine.replica_log(job, 2) is None
    # `sluice job files --replica K` reads each rank's folder on its node
    assert [engine.run_folder(job, k) for k in (0, 1)] == [str(Path(p).parent) for p in logs]
    # `sluice job delete` (and retention) on Ray: once no node still holds an attempt of it
    # (each node's agent asked), each node's replica folder and the checkpoints go
    assert engine.still_running([job, "j-0000000000"]) == []
    assert engine.remove_run_folders(job) >= 3 and job not in engine._gangs.rank0  # nor kept in memory
    assert not any(Path(p).exists() for p in logs) and not (Path(engine.checkpoint_root) / job).exists()
    assert engine.replica_log(job, 1) is None and engine.run_folder(job, 1) is None


def test_a_two_replica_job_resized_to_one_resumes_from_its_checkpoint(
    ray_cluster: RayTestCluster, plane: tuple[Controller, RayEngine, Scripted], tmp_path: Path
) -> None:
    """Elastic resize on Ray: examples/ddp.py placed on two Ray nodes, shrunk 2 → 1 by the
    policy; the Ray gang is stopped through the SDK (rank 0 checkpoints), and the new
    one-replica gang resumes from that step and finishes, no failure counted."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    ctl, engine, policy = plane
    healthy = sorted(n.name for n in engine.nodes())
    two = Allocation(tuple(Assignment(n, 1.0) for n in healthy[:2]))
    stats = tmp_path / "a{attempt}-r{rank}.json"
    spec = JobSpec(
        name="elastic",
        command=["python", "ddp.py", "--steps", "240", "--width", "64", "--step-sleep", "0.01", "--stats", str(stats)],
        workdir=str(EXAMPLES),
        resources={"cpu": 1, "replicas": {"min": 1, "max": 2, "global_batch": 64}},
        checkpoint={"interval_s": 60},  # only the stop saves: the relaunch resumes from it
        max_restarts=0,  # a resize counted as a failure would fail the job
    )
    job = ctl.submit("t", spec).id
    policy.places[job] = two
    # shrink at step 40 of 240: the stop reaches it with 200 steps (over 2 s) to spare
    policy.resizes[job] = (40, Allocation((two.assignments[1],)))
    run_until(ctl, lambda: ctl.book.get(job).phase.terminal, 120)

    final = ctl.book.get(job)
    events = "\n".join(e.message for e in ctl.store.events(job_id=job) if e.kind != "checkpoint")
    assert final.phase == Phase.SUCCEEDED, events
    assert (final.attempt, final.restarts, final.step) == (2, 0, 239), events
    places = [[a["node"] for a in e.data["allocation"]] for e in ctl.store.events(job_id=job) if e.kind == "place"]
    assert places == [healthy[:2], healthy[1:2]], places  # a gang over two Ray nodes, then one
    assert "resized 2 → 1 replicas: test: 1 replica(s)" in events and "stopped for resize" in events
    runs = {a: json.loads((tmp_path / f"a{a}-r0.json").read_text()) for a in (1, 2)}
    assert [runs[a]["world"] for a in (1, 2)] == [2, 1]
    assert [runs[a]["batch"] for a in (1, 2)] == [32, 64]  # keep_global
    assert runs[1]["last"] >= 40 and runs[2]["start"] == runs[1]["last"] + 1  # resumed at the stop's step
    assert runs[2]["first_loss"] < 0.8 * runs[1]["first_loss"]  # and from its weights, not from scratch
    assert runs[2]["metrics"]["world_size"] == 1


def test_a_gang_spanning_two_ray_nodes_survives_losing_one_and_resumes_from_its_checkpoint(
    ray_cluster: RayTestCluster, plane: tuple[Controller, RayEngine, Scripted], tmp_path: Path
) -> None:
    """examples/ddp.py with 2 replicas on two Ray worker nodes; one node dies mid-run (its
    raylet killed, as a machine would vanish). The replica there dies with it, the survivor
    is stopped, and the gang is relaunched whole on two live nodes from rank 0's last
    checkpoint — at world size 2 again — and finishes."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    ctl, _, policy = plane
    stats = tmp_path / "a{attempt}-r{rank}.json"
    spec = JobSpec(
        name="gang-loss",
        command=["python", "ddp.py", "--steps", "600", "--width", "64", "--step-sleep", "0.02", "--stats", str(stats)],
        workdir=str(EXAMPLES),
        resources={"cpu": 1, "replicas": {"min": 2, "max": 2}},
        checkpoint={"interval_s": 1},
        max_restarts=2,
    )
    job = ctl.submit("t", spec).id
    policy.places[job] = Allocation((Assignment("n2", 1.0), Assignment("n3", 1.0)))
    run_until(ctl, lambda: ctl.book.get(job).phase == Phase.RUNNING and ctl.book.get(job).step >= 100, 120)
    at_loss = ctl.book.get(job).step
    ray_cluster.lose("n3")
    try:
        run_until(ctl, lambda: ctl.book.get(job).phase.terminal, 180)
        final = ctl.book.get(job)
        events = "\n".join(e.message for e in ctl.store.events(job_id=job) if e.kind != "checkpoint")
        assert final.phase == Phase.SUCCEEDED, events
        assert final.attempt >= 2 and final.step == 599, events
        places = [[a["node"] for a in e.data["allocation"]] for e in ctl.store.events(job_id=job) if e.kind == "place"]
        assert places[0] == ["n2", "n3"] and len(places) >= 2, places
        assert "n3" not in places[-1] and len(set(places[-1])) == 2, places  # whole again, on live nodes
        last = {r: json.loads((tmp_path / f"a{final.attempt}-r{r}.json").read_text()) for r in (0, 1)}
        assert [last[r]["world"] for r in (0, 1)] == [2, 2]
        # from attempt 1's last checkpoint (1 s apart), not from step 0
        assert 1 < last[0]["start"] <= at_loss + 100, (at_loss, last[0])
        assert last[0]["params_sha256"] == last[1]["params_sha256"]  # the relaunched ranks agree
    finally:
        ray_cluster.add("n3")
        run_until(ctl, lambda: ctl.node("n3").health == NodeHealth.HEALTHY, 60)


def test_a_gang_that_does_not_fit_waits_whole(
    ray_cluster: RayTestCluster, plane: tuple[Controller, RayEngine, Scripted]
) -> None:
    ctl, _, _ = plane
    spec = JobSpec(
        name="toobig",
        command=["python", str(ray_cluster.job_script), "5", "0.01"],
        resources={"cpu": 1, "replicas": {"min": 5}},
    )
    job = ctl.submit("t", spec).id
    for _ in range(5):
        ctl.step()
        time.sleep(0.1)
    assert ctl.book.get(job).phase == Phase.QUEUED and ctl.book.get(job).attempt == 0
    assert "5 replicas" in ctl.book.get(job).reason


@dataclass
class Server:
    """`python -m sluice.server` on the Ray engine, as `sluice up --engine ray` runs it."""

    home: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        (self.home / "server.json").unlink(missing_ok=True)
        log = open(self.home / "server.log", "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.server"], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 90
        while not (self.home / "server.json").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("server did not start:\n" + (self.home / "server.log").read_text()[-3000:])
            time.sleep(0.2)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self) -> Any:
        import httpx

        url = json.loads((self.home / "server.json").read_text())["url"]
        token = (self.home / "token").read_text().strip()
        return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def wait_jobs(server: Server, ids: list[str], done: Callable[[dict[str, Any]], bool], limit_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    with server.client() as http:
        while True:
            jobs = {j["id"]: j for j in http.get("/v1/jobs").json()["items"] if j["id"] in ids}
            if len(jobs) == len(ids) and all(done(j) for j in jobs.values()):
                return jobs
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs did not get there: {[(j['phase'], j['reason']) for j in jobs.values()]}")
            time.sleep(0.3)


def test_kill9_of_the_control_plane_while_jobs_run_on_ray_nodes_adopts_them(
    ray_cluster: RayTestCluster, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "SLUICE_HOME": str(home),
        "SLUICE_ENGINE": "ray",
        "SLUICE_RAY_ADDRESS": ray_cluster.cluster.address,
        "SLUICE_RAY_SHARED_ROOT": str(ray_cluster.shared),
        "SLUICE_POLICY": "kube",
        "SLUICE_PORT": "0",
        "SLUICE_RECONCILE_INTERVAL_S": "0.3",
    }
    server = Server(home, env)
    server.start()
    try:
        with server.client() as http:
            ids = []
            for i in range(3):
                spec = toy(ray_cluster, 160, 0.05, name=f"orphan{i}").model_dump(mode="json", exclude_none=True)
                r = http.post("/v1/jobs", json=spec)
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
        wait_jobs(server, ids, lambda j: j["phase"] == "Running" and j["step"] >= 10, 90)
        server.kill9()

        server.start()
        jobs = wait_jobs(server, ids, lambda j: j["phase"] in ("Succeeded", "Failed", "Cancelled"), 120)
        assert all(j["phase"] == "Succeeded" for j in jobs.values())
        with server.client() as http:
            for jid in ids:
                assert jobs[jid]["attempt"] == 1  # adopted, never relaunched
                why = [e["message"] for e in http.get(f"/v1/jobs/{jid}/why").json()["items"]]
                assert any("adopted running attempt 1" in m for m in why), why
                log = http.get(f"/v1/jobs/{jid}/logs")
                assert log.status_code == 200 and f"attempt 1 of {jid}" in log.text  # from the node's runs folder
                rows = steps_log_at(ray_cluster, jid)
                assert {a for a, _, _ in rows} == {1}
                assert [s for _, s, _ in rows] == list(range(1, 161))  # every step once, in order
    finally:
        server.stop()


def steps_log_at(ray_cluster: RayTestCluster, job_id: str) -> list[tuple[int, int, float]]:
    path = ray_cluster.shared / "checkpoints" / job_id / "checkpoints" / "steps.log"
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(a), int(s), float(t)) for a, s, t in rows]
