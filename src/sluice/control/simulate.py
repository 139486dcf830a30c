"""The simulation driver: the production Controller and a policy, over the `sim` engine.

It wires a MemoryStore, a SimEngine and a Controller, submits the workload's jobs when
their time comes, and moves the virtual clock one scheduling round at a time. The CLI and
the benchmarks reach the simulator only through here (the layering rules keep them away
from engines and policies).
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.control.controller import Controller
from sluice.model import ORACLE_LABEL, JobRecord, NodeInfo, Phase
from sluice.model.queue import QueueConfig
from sluice.policy.base import Policy
from sluice.policy.registry import adapts_batch, make_policy
from sluice.sim.apps import SHIPPED_MODELS, load_applications
from sluice.sim.cpu_profiles import resolve_curve
from sluice.sim.datacache import DataCluster, DataJob
from sluice.sim.engine import SimEngine
from sluice.sim.failures import FailurePlan
from sluice.sim.jobs import CpuJob, GpuAppJob, JobModel, TraceJob
from sluice.sim.replicas import ReplicaJob
from sluice.sim.replicas import ReplicaProfile as ReplicaProfile  # for the benchmarks
from sluice.sim.report import plot_jct_cdf, write_rows
from sluice.sim.workload import WorkloadError, WorkloadJob, cpu_workload, data_workload, load_workload
from sluice.spec import JobSpec
from sluice.spec.job import CpuRange, DatasetMount, QoETarget, ReplicaRange, Resources
from sluice.store import MemoryStore, TenantRecord
from sluice.store.base import QueueRecord

DATA_DOCS = "docs/benchmarks.md, 'Simulator data'"
"""Where a user reads how to get the simulator's data (named in every missing-data error)."""


class SimDataMissing(FileNotFoundError):
    """Data the simulator needs is not where the settings say. The message names the setting
    to change, so the CLI shows it as is (exit 2) rather than a traceback."""


def job_models_dir() -> Path:
    """The per-application job models GPU jobs are built from: SLUICE_POLLUX_TRACES when set,
    else the small set shipped in the package (sluice/sim/models), so a fresh clone simulates."""
    from sluice.settings import load_settings

    return load_settings().pollux_traces or SHIPPED_MODELS


def _checkout_data_dir() -> Path:
    """`shared/data/pollux` beside a source checkout (the development layout), found without a setting."""
    return Path(__file__).resolve().parents[3].parent / "shared" / "data" / "pollux"


def pollux_data_dir() -> Path:
    """Where the Pollux workloads, the Philly trace and the published results are (not shipped:
    large): SLUICE_POLLUX_DATA, else the checkout's `shared/data/pollux`. May not exist; callers
    check what they need with `require_pollux_data`."""
    from sluice.settings import load_settings

    return load_settings().pollux_data or _checkout_data_dir()


def require_pollux_data(*relative: str) -> Path:
    """The Pollux data folder, after checking it holds every `relative` path; SimDataMissing
    naming SLUICE_POLLUX_DATA otherwise."""
    base = pollux_data_dir()
    missing = [r for r in relative if not (base / r).exists()]
    if missing:
        raise SimDataMissing(
            f"the Pollux workloads are not here ({base} has no {', '.join(missing)}): set SLUICE_POLLUX_DATA "
            f"to the folder holding workloads/ and traces/ (see {DATA_DOCS})"
        )
    return base


@dataclass
class SimConfig:
    """nodes × gpus_per_node GPUs, cpus_per_node cores each; interval_s between rounds.

    adaptive_batch: GPU jobs adapt their batch size to their allocation (AdaptDL-style);
    None follows the policy (`adaptive_batch` attribute: pollux, sluice).
    oracle: give policies the simulator's ground truth (exact remaining work, speedup curves,
    restart costs) — an upper-bound study, labelled "oracle (upper bound)" in every result.
    Off, policies see only what a real engine observes.
    """

    nodes: int = 16
    gpus_per_node: int = 4
    cpus_per_node: float | None = None
    interval_s: float = 60.0
    adaptive_batch: bool | None = None
    failures: FailurePlan | None = None
    max_time_s: float | None = None
    traces_dir: Path | None = None
    policy_options: dict[str, Any] = field(default_factory=dict)
    oracle: bool = False
    data: DataCluster | None = None
    """Node dataset caches, for workloads of "data" jobs (what `sluice bench data` scenario 6 uses)."""
    queues: tuple[QueueConfig, ...] = ()
    """Queues with quotas that admission uses (docs/queues.md); jobs name theirs in `WorkloadJob.queue`.
    Empty: only the `default` queue, with no quota."""
    tenant_weights: dict[str, float] = field(default_factory=dict)
    """Fair-share weight per tenant (workload `user`); 1 for a tenant not named."""
    preempt_min_runtime_s: float = 60.0
    """Admission never preempts a job placed less than this long ago (the plane's setting)."""
    background_cpu: float | tuple[tuple[float, float], ...] = 0.0
    """Cores per node busy with work outside the workload (measured on a shared machine): a
    constant, or (end of sample interval s, cores) samples over time. CPU jobs share the rest;
    policies still see the nodes' full size, as on a real node."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes must be at least 1, got {self.nodes}")
        if self.gpus_per_node < 0:
            raise ValueError(f"gpus_per_node must be non-negative, got {self.gpus_per_node}")
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError(f"interval must be a positive number, got {self.interval_s}")
        if self.cpus_per_node is not None and not (math.isfinite(self.cpus_per_node) and self.cpus_per_node > 0):
            raise ValueError(f"cpus_per_node must be a positive number, got {self.cpus_per_node}")


@dataclass(frozen=True)
class JobResult:
    name: str
    kind: str
    submit_s: float
    start_s: float | None
    finish_s: float | None
    restarts: int
    gpus: int
    qoe_target: bool
    qoe_met: bool | None
    read_bytes: float = 0.0
    """Data jobs: bytes of dataset read, and how many of them came from the node's cache."""
    local_bytes: float = 0.0

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.submit_s


def mode_label(oracle: bool) -> str:
    """How a run is labelled: ORACLE_LABEL when policies had the simulator's ground truth."""
    return ORACLE_LABEL if oracle else "observed"


@dataclass
class SimResult:
    policy: str
    jobs: list[JobResult]
    rounds: int
    round_seconds: list[float]
    wall_s: float
    end_s: float
    oracle: bool = False
    """Policies had the simulator's ground truth: an upper bound, not a reachable result."""

    @property
    def mode(self) -> str:
        return mode_label(self.oracle)

    @property
    def label(self) -> str:
        """The policy name as tables print it: `sluice, oracle (upper bound)` in oracle runs."""
        return f"{self.policy}, {ORACLE_LABEL}" if self.oracle else self.policy

    @property
    def finished(self) -> list[JobResult]:
        return [j for j in self.jobs if j.finish_s is not None]

    @property
    def avg_jct_s(self) -> float:
        f = [j.jct_s for j in self.finished if j.jct_s is not None]
        return sum(f) / len(f) if f else math.nan

    @property
    def p99_jct_s(self) -> float:
        f = sorted(j.jct_s for j in self.finished if j.jct_s is not None)
        if not f:
            return math.nan
        return f[min(len(f) - 1, math.ceil(0.99 * len(f)) - 1)]

    @property
    def makespan_s(self) -> float:
        if not self.jobs:
            return 0.0
        done = [j.finish_s for j in self.finished if j.finish_s is not None]
        return (max(done) if done else self.end_s) - min(j.submit_s for j in self.jobs)

    @property
    def restarts(self) -> int:
        return sum(j.restarts for j in self.jobs)

    @property
    def restarts_per_job_hour(self) -> float:
        """Restarts per hour of job time (submit to finish, summed): what churn costs jobs."""
        hours = sum(j.jct_s or 0.0 for j in self.finished) / 3600
        return self.restarts / hours if hours > 0 else 0.0

    @property
    def local_read_share(self) -> float | None:
        """Share of dataset bytes read from the node's own cache (None: no data jobs)."""
        total = sum(j.read_bytes for j in self.jobs)
        return sum(j.local_bytes for j in self.jobs) / total if total else None

    @property
    def qoe(self) -> tuple[int, int]:
        """(targets met, jobs with a target)."""
        t = [j for j in self.jobs if j.qoe_target]
        return sum(1 for j in t if j.qoe_met), len(t)

    @property
    def mean_round_s(self) -> float:
        return sum(self.round_seconds) / len(self.round_seconds) if self.round_seconds else 0.0

    @property
    def max_round_s(self) -> float:
        return max(self.round_seconds, default=0.0)

    def rows(self) -> list[dict[str, Any]]:
        """Per-job results, one dict per job (what --out writes)."""
        return [
            {
                "name": j.name,
                "kind": j.kind,
                "gpus": j.gpus,
                "submit_s": round(j.submit_s, 1),
                "start_s": None if j.start_s is None else round(j.start_s, 1),
                "finish_s": None if j.finish_s is None else round(j.finish_s, 1),
                "jct_s": None if j.jct_s is None else round(j.jct_s, 1),
                "restarts": j.restarts,
                "qoe_target": j.qoe_target,
                "qoe_met": j.qoe_met,
                "mode": self.mode,
            }
            for j in self.jobs
        ]

    def summary(self) -> dict[str, Any]:
        met, total = self.qoe
        return {
            "policy": self.policy,
            "mode": self.mode,
            "jobs": len(self.jobs),
            "finished": len(self.finished),
            "avg_jct_h": self.avg_jct_s / 3600,
            "p99_jct_h": self.p99_jct_s / 3600,
            "makespan_h": self.makespan_s / 3600,
            "restarts": self.restarts,
            "restarts_per_job_hour": self.restarts_per_job_hour,
            "qoe_met": met,
            "qoe_targets": total,
            "rounds": self.rounds,
            "mean_round_ms": self.mean_round_s * 1000,
            "max_round_ms": self.max_round_s * 1000,
            "wall_s": self.wall_s,
        }


_NAME_OK = re.compile(r"[^a-z0-9._-]+")


def _spec_name(name: str) -> str:
    s = _NAME_OK.sub("-", name.lower()).strip("-._")[:63].rstrip("-._")
    return s or "job"


def build_model(job: WorkloadJob, adaptive: bool, traces_dir: Path, data: DataCluster | None = None) -> JobModel:
    """The simulated behaviour of one workload job."""
    if job.kind == "gpu":
        apps = load_applications(str(traces_dir)) if traces_dir.is_dir() else {}
        if not apps:
            raise SimDataMissing(
                f"no job models under {traces_dir}: SLUICE_POLLUX_TRACES must name a folder holding "
                f"<application>/placements.csv; unset it to use the models shipped with sluice (see {DATA_DOCS})"
            )
        if job.application not in apps:
            raise WorkloadError(f"job {job.name}: unknown application {job.application!r}; known: {', '.join(apps)}")
        app = apps[job.application]
        return GpuAppJob(app, job.batch_size or app.init_batch_size, job.gpus, adaptive)
    if job.kind == "trace":
        return TraceJob(float(job.duration_s or 0.0), job.gpus)
    if job.kind == "cpu":
        return CpuJob(resolve_curve(job.cpu_profile or "mlp"), int(job.cpu_steps or 1000))
    if job.kind == "replicas":
        if job.replica_profile is None:
            raise WorkloadError(f"job {job.name}: a replicas job needs its measured replica_profile")
        return ReplicaJob(job.replica_profile, int(job.cpu_steps or 1000))
    if job.kind == "data":
        if data is None or job.dataset not in data.sizes:
            raise WorkloadError(f"job {job.name}: dataset {job.dataset!r} is not in the simulated data cluster")
        return DataJob(data, job.dataset, int(job.epochs or 1), float(job.epoch_s or 0.0))
    raise WorkloadError(f"job {job.name}: unknown kind {job.kind!r}")


def build_spec(job: WorkloadJob, model: JobModel) -> JobSpec:
    """The JobSpec a user would have submitted for this workload job."""
    qoe = None
    if job.qoe_loss is not None or job.qoe_deadline_s is not None:
        qoe = QoETarget(loss=job.qoe_loss, deadline_s=job.qoe_deadline_s)
    if job.kind in ("cpu", "data"):
        res = Resources(cpu=CpuRange(min=job.cpus or 1.0, max=job.cpu_max))
    elif job.kind == "replicas":
        res = Resources(
            cpu=CpuRange(min=job.cpus or 1.0),
            replicas=ReplicaRange(min=job.replicas_min, max=max(job.replicas_max, job.replicas_min)),
        )
    else:
        most = model.max_gpus if isinstance(model, GpuAppJob | TraceJob) else job.gpus
        res = Resources(
            cpu=CpuRange(min=1.0),
            gpus=1,
            replicas=ReplicaRange(min=min(job.gpus, 1024), max=min(max(job.gpus, most), 1024)),
        )
    return JobSpec(
        name=_spec_name(job.name),
        command=["sim-job", job.name],
        resources=res,
        queue=job.queue,
        qoe=qoe,
        max_restarts=100,
        labels={"sim.kind": job.kind},
        datasets=[DatasetMount(name=job.dataset)] if job.dataset else [],
    )


def node_names(nodes: int) -> list[str]:
    """The simulated nodes' names, as `--fail-at` gives them: n0..n9, n00..n15, n000..n099, ..."""
    width = len(str(nodes - 1))
    return [f"n{i:0{width}d}" for i in range(nodes)]


def _uses_cpu_nodes(workload: list[WorkloadJob]) -> bool:
    return any(j.kind in ("cpu", "data", "replicas") for j in workload)


def node_cores(cfg: SimConfig, cpu_jobs: bool) -> float:
    """Cores per simulated node: as configured, else 8 for CPU workloads and 4 per GPU (at least 8) otherwise."""
    return cfg.cpus_per_node or (8.0 if cpu_jobs else max(8.0, 4.0 * cfg.gpus_per_node))


def make_nodes(cfg: SimConfig, cpu_jobs: bool) -> list[NodeInfo]:
    cpus = node_cores(cfg, cpu_jobs)
    return [NodeInfo(name, cpus, cfg.gpus_per_node) for name in node_names(cfg.nodes)]


def never_placed(workload: list[WorkloadJob], cfg: SimConfig) -> list[tuple[WorkloadJob, str]]:
    """Jobs no placement on this cluster could ever hold, each with why. The simulated cluster
    does not grow, so such a job would wait for ever and the run would never end.

    A GPU job (gpu, trace) runs at least `gpus` replicas of one GPU each (as `build_spec` asks,
    capped at 1024): more than the cluster's GPUs never fit. A CPU or data job needs its `cpus`
    (default 1) on one node; a replicas job `replicas_min` of them."""
    cores = node_cores(cfg, _uses_cpu_nodes(workload))
    total_gpus = cfg.nodes * cfg.gpus_per_node
    out = []
    for j in workload:
        need = 1.0 if j.cpus is None else j.cpus
        if j.kind in ("gpu", "trace"):
            if min(j.gpus, 1024) > total_gpus:
                why = f"needs {j.gpus} GPUs but the cluster has {total_gpus} ({cfg.nodes} nodes x {cfg.gpus_per_node})"
                out.append((j, why))
        elif need > cores + 1e-9:
            out.append((j, f"needs {need:g} cores on one node but a node has {cores:g}"))
        elif j.kind == "replicas" and j.replicas_min * need > cfg.nodes * cores + 1e-9:
            out.append(
                (j, f"needs {j.replicas_min} replicas of {need:g} cores but the cluster has {cfg.nodes * cores:g}")
            )
    return out


def preflight(workload: list[WorkloadJob], cfg: SimConfig) -> None:
    """Check what would otherwise fail or hang only once the run reaches the job: every GPU
    job's application has a job model, and every job fits the cluster (`never_placed`).
    WorkloadError (or SimDataMissing) naming the first bad job and how many there are."""
    gpu = [j for j in workload if j.kind == "gpu"]
    if gpu:
        traces = cfg.traces_dir or job_models_dir()
        apps = load_applications(str(traces)) if traces.is_dir() else {}
        if not apps:
            build_model(gpu[0], False, traces, cfg.data)  # raises SimDataMissing naming the setting
        unknown = [j for j in gpu if j.application not in apps]
        if unknown:
            more = f" (and {len(unknown) - 1} more job(s) like it)" if len(unknown) > 1 else ""
            raise WorkloadError(
                f"job {unknown[0].name!r}: unknown application {unknown[0].application!r}{more}; "
                f"known: {', '.join(apps)}"
            )
    bad = never_placed(workload, cfg)
    if bad:
        job, why = bad[0]
        more = f" ({len(bad)} such jobs)" if len(bad) > 1 else ""
        raise WorkloadError(f"job {job.name!r} {why}, so it could never be placed{more}")


def run_simulation(
    workload: list[WorkloadJob],
    policy: str | Policy,
    cfg: SimConfig | None = None,
    on_round: Callable[[float, int, int], None] | None = None,
    observe: Callable[[float, list[JobRecord]], None] | None = None,
) -> SimResult:
    """Run the workload to completion (or `cfg.max_time_s`) and return per-job results.

    on_round(now, jobs finished, jobs total) is called after every round (progress bars);
    observe(now, live jobs) after every round too, with the book's records (what a metrics
    scraper of the real plane would see: phases, allocations, waiting reasons).
    """
    cfg = cfg or SimConfig()
    # The policy's own interval defaults to the round; `policy_options` may set another
    # (the plane's reconcile round vs FlowCon's Δ, as `sluice bench simreal` mirrors).
    pol = make_policy(policy, **{"interval_s": cfg.interval_s, **cfg.policy_options})
    adaptive = cfg.adaptive_batch if cfg.adaptive_batch is not None else adapts_batch(pol)
    traces = cfg.traces_dir or job_models_dir()
    nodes = make_nodes(cfg, _uses_cpu_nodes(workload))
    engine = SimEngine(nodes, cfg.failures, oracle=cfg.oracle, data=cfg.data, background_cpu=cfg.background_cpu)
    sizes = cfg.data.sizes if cfg.data is not None else {}
    store = MemoryStore(keep_events=False)
    for queue in cfg.queues:
        store.save_queue(QueueRecord(queue, 0.0))
    for tenant in sorted({j.user for j in workload}):
        store.create_tenant(TenantRecord(tenant, token_hash="", weight=cfg.tenant_weights.get(tenant, 1.0)))
    named = {q.name for q in cfg.queues}
    for queue_name, tenant in sorted({(j.queue, j.user) for j in workload if j.queue in named}):
        store.grant_queue(queue_name, tenant)  # a workload's tenants may use the queues its jobs name
    ctl = Controller(
        store,
        engine,
        pol,
        checkpoint_root="sim://ckpt",
        record_waits=False,
        dataset_bytes=lambda rec: {d.name: sizes[d.name] for d in rec.spec.datasets if d.name in sizes},
        oracle=engine.oracle_source,
        preempt_min_runtime_s=cfg.preempt_min_runtime_s,
    )

    todo = deque(sorted(workload, key=lambda j: j.submit_time))
    ids: dict[str, WorkloadJob] = {}
    models: dict[str, JobModel] = {}
    round_s: list[float] = []
    t = 0.0
    wall0 = time.perf_counter()
    while todo or ctl.book.live_ids():
        if not ctl.book.live_ids() and todo and todo[0].submit_time > t:
            # Nothing to run until the next arrival: jump there, on the round grid.
            nxt = math.ceil(todo[0].submit_time / cfg.interval_s) * cfg.interval_s
            engine.advance(nxt)
            t = nxt
        while todo and todo[0].submit_time <= t:
            wj = todo.popleft()
            job_id = f"s{len(ids):06d}"
            model = build_model(wj, adaptive, traces, cfg.data)
            engine.add_job(job_id, model)
            ctl.submit(wj.user, build_spec(wj, model), job_id=job_id)
            ids[job_id] = wj
            models[job_id] = model
        ctl.step()
        spent = ctl.round_seconds
        if any(j.phase == Phase.STOPPING for j in ctl.book.live()):
            # Stops complete at once in the sim: settle them in the same round so freed GPUs
            # are reused now, as the paper's simulator does, rather than one round later.
            ctl.step()
            spent += ctl.round_seconds
        round_s.append(spent)
        if observe is not None:
            observe(t, ctl.book.live())
        if on_round is not None:
            on_round(t, len(engine.completed_at), len(workload))
        if cfg.max_time_s is not None and t >= cfg.max_time_s:
            break
        t += cfg.interval_s
        engine.advance(t)
    ctl.step()  # take in the last exits
    wall = time.perf_counter() - wall0

    results = []
    for job_id, wj in ids.items():
        rec = ctl.book.get(job_id)
        assert rec is not None
        model = models[job_id]
        finish = engine.completed_at.get(job_id)
        target = wj.qoe_loss is not None or wj.qoe_deadline_s is not None
        met: bool | None = None
        if target:
            met = True
            if wj.qoe_loss is not None:
                at = rec.qoe_met_at
                met = at is not None
                if at is not None and wj.qoe_deadline_s is not None:
                    met = at <= wj.submit_time + wj.qoe_deadline_s
            elif wj.qoe_deadline_s is not None:
                met = finish is not None and finish <= wj.submit_time + wj.qoe_deadline_s
        results.append(
            JobResult(
                name=wj.name,
                kind=wj.kind,
                submit_s=wj.submit_time,
                start_s=engine.first_start.get(job_id),
                finish_s=finish,
                restarts=max(0, model.restarts),
                gpus=wj.gpus,
                qoe_target=target,
                qoe_met=met,
                read_bytes=model.read_bytes if isinstance(model, DataJob) else 0.0,
                local_bytes=model.local_bytes if isinstance(model, DataJob) else 0.0,
            )
        )
    return SimResult(
        policy if isinstance(policy, str) else pol.name, results, len(round_s), round_s, wall, t, oracle=cfg.oracle
    )


__all__ = [
    "DataCluster",
    "FailurePlan",
    "JobResult",
    "SimConfig",
    "SimResult",
    "WorkloadError",
    "WorkloadJob",
    "cpu_workload",
    "data_workload",
    "load_workload",
    "never_placed",
    "node_names",
    "plot_jct_cdf",
    "preflight",
    "run_simulation",
    "write_rows",
]


def policy_names(variants: bool = True) -> list[str]:
    """Every policy name the simulator runs, variants (pollux-prior, sluice-gns, ...) included
    unless `variants` is false: the registry's one list, for the CLI, which may not import
    policies itself."""
    from sluice.policy.registry import policy_names as registered

    return registered(variants)
