"""`sluice bench ray`: the Ray engine on a real 3-node Ray cluster on this machine.

Three measurements, in one run:

1. migration time per example job: checkpoint on one node (stop with SIGTERM until the
   job has saved and exited) + restart on another (until the new attempt's first report);
2. recovery after node loss: a node's raylet is killed while an example runs there; time
   until Ray declares it dead, and from then until the job reports again elsewhere, plus
   the steps that had to be done again;
3. the mixed workload of `sluice bench local` on the local engine and on the 3-node Ray
   cluster, side by side, under the same policy.

The Ray cluster is `ray.cluster_utils.Cluster` (separate raylets, one machine), so the
numbers show the engine's own overhead, not a network's.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sluice.bench.local import print_report
from sluice.bench.scenario import RunResult, embedded_plane, example_spec, mixed_workload, run_workload
from sluice.control.plane import ControlPlane
from sluice.model import Allocation, ClusterView, Decision, JobRecord, Migrate, Phase
from sluice.policy.base import Policy

OBJECT_STORE = 80 * 1024 * 1024
EXAMPLES = ("mlp", "cnn", "lstm", "autoencoder")


@dataclass
class RayBenchCluster:
    cluster: Any
    nodes: dict[str, Any]

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def lose(self, name: str) -> None:
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)

    def add(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(
            num_cpus=1, object_store_memory=OBJECT_STORE, labels={"sluice.node": name}
        )
        self.cluster.wait_for_nodes()


@contextlib.contextmanager
def ray_cluster(workers: int = 3) -> Iterator[RayBenchCluster]:
    """A head (r0) with no CPU for jobs, as in deploy/kuberay, and `workers` worker nodes
    r1.. of 1 CPU each, named by the sluice.node label. Only workers can be lost."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "object_store_memory": OBJECT_STORE,
            "include_dashboard": False,
            "labels": {"sluice.node": "r0"},
        },
    )
    rc = RayBenchCluster(cluster, {"r0": cluster.head_node})
    try:
        for i in range(1, workers + 1):
            rc.add(f"r{i}")
        yield rc
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


class MoveOnRequest:
    """Wraps a policy and adds the migrations the benchmark asks for (a function of the view)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.moves: dict[str, str] = {}

    def decide(self, view: ClusterView) -> list[Decision]:
        out = self.inner.decide(view)
        for job_id, node in list(self.moves.items()):
            job = view.jobs.get(job_id)
            if job is not None and job.phase == Phase.RUNNING:
                del self.moves[job_id]
                cpu = job.allocation.assignments[0].cpu_request if job.allocation else job.cpu_min
                out.append(Migrate(job_id, Allocation.single(node, cpu), f"benchmark moves it to {node}"))
        return out


def _wait(plane: ControlPlane, job_id: str, cond: Any, limit_s: float = 600.0) -> Any:
    admin = _admin(plane)
    deadline = time.monotonic() + limit_s
    while True:
        job = plane.get_job(admin, job_id)
        if cond(job):
            return job
        if time.monotonic() > deadline or job.phase.terminal:
            raise RuntimeError(f"{job.spec.name}: gave up waiting ({job.phase}: {job.reason})")
        time.sleep(0.1)


def _admin(plane: ControlPlane) -> Any:
    return next(t for t in plane.store.list_tenants() if t.admin)


def _resumed_at(plane: ControlPlane, job_id: str, attempt: int) -> tuple[float, int]:
    """Time and step of the first report of `attempt`, as the Ray engine saw it."""
    from sluice.engine.ray import RayEngine

    engine = plane.controller.engine
    if not isinstance(engine, RayEngine):
        raise RuntimeError(f"this part needs the Ray engine, not {engine.name!r}")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        h = engine.job_hints(job_id)
        job = _job(plane, job_id)
        if h.get("reporting_attempt") == attempt:
            return float(h["resumed_at"]), job.step
        time.sleep(0.05)
    raise RuntimeError(f"{job_id}: attempt {attempt} never reported")


def _launch_to_running_s(plane: ControlPlane, job_id: str, attempt: int) -> float | None:
    """From the controller placing `attempt` to the engine reporting its process started:
    the engine's own share of a move (the rest is the job starting up and loading)."""
    placed = running = None
    for e in plane.store.events(job_id=job_id):
        if e.kind == "place" and (e.data or {}).get("attempt") == attempt:
            placed = e.time
        elif placed is not None and e.kind == "phase" and (e.data or {}).get("to") == str(Phase.RUNNING):
            running = e.time
            break
    return None if placed is None or running is None else running - placed


def _job(plane: ControlPlane, job_id: str) -> JobRecord:
    job = plane.controller.book.get(job_id)
    if job is None:
        raise RuntimeError(f"job {job_id} is unknown")
    return job


def _node(plane: ControlPlane, job_id: str) -> str:
    alloc = _job(plane, job_id).allocation
    return alloc.primary_node if alloc else "?"


def measure_migrations(
    rc: RayBenchCluster, home: Path, shared: Path, scale: float, console: Console
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with embedded_plane(home, "kube", engine="ray", ray_address=rc.address, ray_shared_root=str(shared)) as plane:
        mover = MoveOnRequest(plane.controller.policy)
        plane.controller.policy = mover
        admin = _admin(plane)
        for name in EXAMPLES:
            spec = example_spec(
                name, name=f"move-{name}", env={"EXAMPLE_SCALE": f"{scale:g}"}, resources={"cpu": {"min": 1.0}}
            )
            job = plane.submit(admin, spec)
            _wait(plane, job.id, lambda j: j.phase == Phase.RUNNING and j.step > 0)
            time.sleep(3.0)  # let it train a little past its first report
            src = _node(plane, job.id)
            dst = next(n for n in sorted(rc.nodes) if n not in (src, "r0"))
            t0 = time.time()
            mover.moves[job.id] = dst
            _wait(plane, job.id, lambda j: j.attempt == 2)
            t_exit = time.time()
            step_before = _job(plane, job.id).step
            t_first, step_after = _resumed_at(plane, job.id, 2)
            recorded = _job(plane, job.id).last_stop_s
            stop_s = float(recorded) if isinstance(recorded, int | float) else t_exit - t0
            rows.append(
                {
                    "job": name,
                    "from": src,
                    "to": _node(plane, job.id),
                    "checkpoint_stop_s": stop_s,
                    "restart_s": max(0.0, (t_first - t0) - stop_s),
                    "total_s": t_first - t0,
                    "launch_to_running_s": _launch_to_running_s(plane, job.id, 2),
                    "step_before": step_before,
                    "step_after": step_after,
                }
            )
            console.print(f"  {name}: {src} -> {rows[-1]['to']} in {rows[-1]['total_s']:.2f}s")
            plane.cancel(admin, job.id)
            _wait(plane, job.id, lambda j: j.phase.terminal)
            time.sleep(1.0)
    return rows


def measure_node_loss(rc: RayBenchCluster, home: Path, shared: Path, scale: float, console: Console) -> dict[str, Any]:
    with embedded_plane(home, "kube", engine="ray", ray_address=rc.address, ray_shared_root=str(shared)) as plane:
        admin = _admin(plane)
        # Full length: it is cancelled once it has resumed, so only the time to get there counts.
        spec = example_spec(
            "mlp",
            name="survivor",
            env={"EXAMPLE_SCALE": "1"},
            resources={"cpu": {"min": 1.0}},
            checkpoint={"interval_s": 5.0},
        )
        job = plane.submit(admin, spec)
        # Lose the node mid-run: after a checkpoint, with some work done since.
        first_step = int(_wait(plane, job.id, lambda j: j.phase == Phase.RUNNING and j.checkpoint is not None).step)
        _wait(plane, job.id, lambda j: j.step >= first_step + 20)
        victim = _node(plane, job.id)
        step_lost = _job(plane, job.id).step
        t0 = time.time()
        rc.lose(victim)
        _wait(plane, job.id, lambda j: j.attempt >= 2)
        t_requeued = time.time()
        t_first, step_after = _resumed_at(plane, job.id, _job(plane, job.id).attempt)
        plane.cancel(admin, job.id)
        _wait(plane, job.id, lambda j: j.phase.terminal)
        rc.add(victim)
        out = {
            "job": "mlp",
            "node": victim,
            "detect_and_requeue_s": t_requeued - t0,
            "resume_s": t_first - t_requeued,
            "total_s": t_first - t0,
            "launch_to_running_s": _launch_to_running_s(plane, job.id, _job(plane, job.id).attempt),
            "step_at_loss": step_lost,
            "resumed_at_step": step_after,
        }
        console.print(f"  node {victim} lost: job reporting again after {out['total_s']:.2f}s")
        return out


def measure_mixed(
    engine: str,
    home: Path,
    policy: str,
    stagger_s: float,
    scale: float,
    interval_s: float,
    console: Console,
    **extra: object,
) -> RunResult:
    console.print(f"[bold]mixed workload on the {engine} engine ({policy})[/] ...")
    with embedded_plane(home / engine, policy, engine=engine, policy_interval_s=interval_s, **extra) as plane:
        res = run_workload(plane, mixed_workload(stagger_s, scale))
    res.policy = f"{engine} ({policy})"
    console.print(f"  {engine}: avg JCT {res.avg_jct_s:.1f}s, makespan {res.makespan_s:.1f}s, ok {res.succeeded}")
    return res


def run(
    policy: str = "flowcon",
    stagger_s: float = 10.0,
    scale: float = 1.0,
    move_scale: float = 0.5,
    policy_interval_s: float = 10.0,
    parts: str = "migrate,loss,mixed",
    out: Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    console = console or Console()
    wanted = {p.strip() for p in parts.split(",") if p.strip()}
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-bench-ray-") as tmp:
        results: list[RunResult] = []
        if "mixed" in wanted:  # the local run goes first, with no Ray processes around
            results.append(
                measure_mixed("local", Path(tmp) / "mixed", policy, stagger_s, scale, policy_interval_s, console)
            )
        with ray_cluster(workers=3) as rc:
            console.print(f"Ray cluster at {rc.address}: head r0 (no job CPU), workers r1-r3 (1 CPU each)")
            if "mixed" in wanted:
                results.append(
                    measure_mixed(
                        "ray",
                        Path(tmp) / "mixed",
                        policy,
                        stagger_s,
                        scale,
                        policy_interval_s,
                        console,
                        ray_address=rc.address,
                        ray_shared_root=str(Path(tmp) / "shared"),
                    )
                )
            if "migrate" in wanted:
                console.print("[bold]migration per example job[/] ...")
                report["migrations"] = measure_migrations(
                    rc, Path(tmp) / "migrate", Path(tmp) / "shared", move_scale, console
                )
                _print_migrations(report["migrations"], console)  # now: a later part may fail
            if "loss" in wanted:
                console.print("[bold]recovery after node loss[/] ...")
                report["node_loss"] = measure_node_loss(
                    rc, Path(tmp) / "loss", Path(tmp) / "shared", move_scale, console
                )
                _print_loss(report["node_loss"], console)
        if results:
            print_report(results, console)
            report["mixed"] = [
                {"engine": r.policy, "avg_jct_s": r.avg_jct_s, "makespan_s": r.makespan_s, "ok": r.succeeded}
                for r in results
            ]
    if out is not None:
        out.write_text(json.dumps(report, indent=2))
    return report


def _print_migrations(rows: list[dict[str, Any]], console: Console) -> None:
    t = Table(title="migration across Ray nodes (checkpoint + restart)")
    for col in (
        "job",
        "from → to",
        "checkpoint+stop (s)",
        "launch → running (s)",
        "restart to first report (s)",
        "total (s)",
        "step",
    ):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            r["job"],
            f"{r['from']} → {r['to']}",
            f"{r['checkpoint_stop_s']:.2f}",
            _secs(r["launch_to_running_s"]),
            f"{r['restart_s']:.2f}",
            f"{r['total_s']:.2f}",
            f"{r['step_before']} → {r['step_after']}",
        )
    console.print(t)


def _print_loss(r: dict[str, Any], console: Console) -> None:
    t = Table(title="recovery after losing a Ray node (raylet SIGKILLed)")
    for col in (
        "job",
        "node",
        "detected+requeued (s)",
        "launch → running (s)",
        "resume to first report (s)",
        "total (s)",
        "step at loss → resumed at",
    ):
        t.add_column(col, justify="right")
    t.add_row(
        r["job"],
        r["node"],
        f"{r['detect_and_requeue_s']:.2f}",
        _secs(r["launch_to_running_s"]),
        f"{r['resume_s']:.2f}",
        f"{r['total_s']:.2f}",
        f"{r['step_at_loss']} → {r['resumed_at_step']}",
    )
    console.print(t)


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
