"""The `sim` engine: a discrete-event cluster with a virtual clock.

It implements the Engine protocol (structurally — `sim` may import only `model`), so the
production Controller and policies run against it unchanged. Time moves only when the
driver calls `advance(to)`: every running job's model is stepped to that time, completions
land at their exact virtual time, and the events a real engine would report (JobStarted,
JobProgress, JobUsage, JobExited, NodeLost/NodeUp) queue up for the next `poll()`.

It reports only what a real engine could observe: starts, exits, the steps, loss and
declared total steps a job's `sdk.report` would send, and CPU usage. Its ground truth (each
job's exact remaining work, speedup curve and restart cost) is offered only when it is built
with `oracle=True`, as `oracle_source`, which the driver must hand to the Controller
explicitly; results of such a run are upper bounds, labelled so.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.model import (
    Allocation,
    EngineCapabilities,
    Event,
    JobExited,
    JobProgress,
    JobStarted,
    JobUsage,
    LaunchRequest,
    NodeCache,
    NodeInfo,
    NodeLost,
    NodeUp,
    OracleInfo,
)
from sluice.sim.datacache import DataCluster
from sluice.sim.failures import FailurePlan
from sluice.sim.jobs import GpuAppJob, JobModel


class CapacityError(ValueError):
    """A launch or resize asked for more GPUs than a node has free (a policy bug)."""


class SimOracle:
    """The simulator's ground truth about its jobs (an `OracleSource`): for upper-bound
    studies only. Exists only on a SimEngine built with `oracle=True`."""

    def __init__(self, models: dict[str, JobModel]) -> None:
        self._models = models

    def oracle(self, job_id: str) -> OracleInfo | None:
        model = self._models.get(job_id)
        return None if model is None else model.oracle()


@dataclass
class _Run:
    attempt: int
    allocation: Allocation
    cpu_s: float = 0.0
    """CPU-seconds the attempt has had so far (the counter a real node reads from its cgroup)."""


class SimEngine:
    name = "sim"
    capabilities = EngineCapabilities(
        live_cpu_resize=True,
        gpu_resize=True,  # a GPU change is modelled as a restart: the job model charges its restart penalty
        gang_launch=True,
        migration=True,
        job_progress=True,
        measured_throughput=True,
        max_replicas=1024,
    )
    checkpoint_root: str | None = None  # simulated checkpoints are not files

    def __init__(
        self,
        nodes: list[NodeInfo],
        failures: FailurePlan | None = None,
        progress_events: bool = True,
        oracle: bool = False,
        data: DataCluster | None = None,
        background_cpu: float | Sequence[tuple[float, float]] = 0.0,
    ):
        """oracle: offer the simulator's ground truth (`oracle_source`) for upper-bound studies.
        data: node dataset caches, reported as NodeCache events as a node agent would.
        background_cpu: cores per node taken by processes outside the simulated jobs (a shared
        machine, measured): a constant, or samples (end of the sample's interval, cores) in
        time order; CPU jobs share what is left. Nodes still report their full size, as a
        real node does."""
        self._background: list[tuple[float, float]] = (
            [(float("inf"), float(background_cpu))]
            if isinstance(background_cpu, int | float)
            else sorted(background_cpu) or [(float("inf"), 0.0)]
        )
        self._background_ends = [t for t, _ in self._background]
        self.now = 0.0
        self._nodes = {n.name: n for n in nodes}
        self._lost: dict[str, float] = {}
        self._models: dict[str, JobModel] = {}
        self._runs: dict[str, _Run] = {}
        self._gpu_used: dict[str, int] = dict.fromkeys(self._nodes, 0)
        self._events: list[Event] = []
        self.failures = failures
        self.progress_events = progress_events
        self.completed_at: dict[str, float] = {}
        self.first_start: dict[str, float] = {}
        self.node_losses = 0
        self.oracle_source: SimOracle | None = SimOracle(self._models) if oracle else None
        self.data = data
        if data is not None:
            data.changed.update(self._nodes)  # report every (empty) cache once
        """Ground truth for the Controller's `oracle` argument; None unless built with oracle=True."""

    # ----------------------------------------------------------------- set-up

    def add_job(self, job_id: str, model: JobModel) -> None:
        """Bind the model that decides how a job progresses (before it is submitted)."""
        self._models[job_id] = model

    def model(self, job_id: str) -> JobModel:
        return self._models[job_id]

    # ----------------------------------------------------------------- Engine protocol

    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes.values())

    def clock(self) -> float:
        return self.now

    def alive(self) -> dict[str, int]:
        return {j: r.attempt for j, r in self._runs.items()}

    def log_path(self, job_id: str) -> str | None:
        return None

    def earlier_logs(self, job_id: str) -> list[str]:
        return []

    def replica_log(self, job_id: str, rank: int) -> str | None:
        return None

    def close(self) -> None:
        return None

    def poll(self) -> list[Event]:
        if self.data is not None:
            for node in sorted(self.data.changed & self._nodes.keys()):
                held = {d: 1.0 for d in self.data.held(node)}
                self._events.append(NodeCache(node, self.now, held, self.data.free_bytes(node)))
            self.data.changed.clear()
        out, self._events = self._events, []
        return out

    def launch(self, req: LaunchRequest) -> None:
        model = self._models.get(req.job_id)
        if model is None:
            raise KeyError(f"sim engine has no model for job {req.job_id}")
        lost = [n for n in req.allocation.nodes if n in self._lost or n not in self._nodes]
        if lost:
            self._events.append(
                JobExited(req.job_id, req.attempt, self.now, -9, f"node lost: {lost[0]}", node_lost=True)
            )
            return
        self._take(req.allocation, None)
        model.place(req.allocation)
        self._runs[req.job_id] = _Run(req.attempt, req.allocation)
        self.first_start.setdefault(req.job_id, self.now)
        self._events.append(JobStarted(req.job_id, req.attempt, req.allocation.primary_node, self.now))

    def resize(self, job_id: str, attempt: int, allocation: Allocation) -> None:
        run = self._runs.get(job_id)
        if run is None or run.attempt != attempt:
            return
        self._take(allocation, run.allocation)
        self._models[job_id].reallocate(allocation)
        run.allocation = allocation

    def stop(self, job_id: str, attempt: int, checkpoint: bool = True) -> None:
        run = self._runs.get(job_id)
        if run is None or run.attempt != attempt:
            return
        model = self._models[job_id]
        if not checkpoint and self.failures is not None:
            model.rollback(self.failures.lost_work_s())
        self._release(job_id)
        model.suspend()
        why = "checkpointed and stopped" if checkpoint else "killed"
        self._events.append(JobExited(job_id, attempt, self.now, 0 if checkpoint else -9, why))

    # ----------------------------------------------------------------- virtual time

    def advance(self, to: float) -> None:
        """Run the cluster until virtual time `to`."""
        if to < self.now:
            raise ValueError(f"time runs forward only: at {self.now}, asked for {to}")
        cuts: list[tuple[float, str | None]] = []
        cuts.extend((back, None) for back in self._lost.values() if back <= to)
        if self.failures is not None:
            alive = [n for n in self._nodes if n not in self._lost]
            cuts.extend(self.failures.losses(self.now, to, alive))
        cuts.sort(key=lambda c: c[0])
        for t, node in cuts:
            self._run_until(t)
            if node is None:
                self._repairs(t)
            elif node not in self._lost:
                self._lose(node, t)
        self._run_until(to)
        self._repairs(to)

    def _run_until(self, t: float) -> None:
        dt = t - self.now
        if dt <= 0:
            return
        shares = self._cpu_shares()
        finished: list[tuple[str, float]] = []
        for job_id, run in self._runs.items():
            model = self._models[job_id]
            cpu = shares.get(job_id, run.allocation.total_cpu_request)
            used = model.advance(dt, cpu)
            if used is not None:
                finished.append((job_id, self.now + used))
            elif self.progress_events and not getattr(model, "starting", False):
                # (a model that says it is still starting has run no step: a real job reports none)
                metrics: dict[str, float] = {"total_steps": model.total_steps}
                if isinstance(model, GpuAppJob):
                    metrics.update(model.noise_metrics())
                self._events.append(JobProgress(job_id, run.attempt, t, model.step, model.loss(), metrics))
            if model.kind == "cpu":
                run.cpu_s += cpu * (dt if used is None else used)
                self._events.append(JobUsage(job_id, run.attempt, t, cpu, cpu_s=run.cpu_s))
        for job_id, at in finished:
            run = self._runs[job_id]
            model = self._models[job_id]
            self._events.append(
                JobProgress(
                    job_id, run.attempt, at, model.total_steps, model.loss(), {"total_steps": model.total_steps}
                )
            )
            self._events.append(JobExited(job_id, run.attempt, at, 0, "completed"))
            self.completed_at[job_id] = at
            self._release(job_id)
        self.now = t

    def _cpu_shares(self) -> dict[str, float]:
        """Cores each CPU job gets: the kernel's weighted fair share (weights = requests),
        capped by the job's limit and by what it can use, spare cores handed on (water-filling)."""
        per_node: dict[str, list[tuple[str, float, float]]] = {}
        for job_id, run in self._runs.items():
            model = self._models[job_id]
            if model.kind != "cpu":
                continue
            a = run.allocation.assignments[0]
            cap = model.cpu_demand(run.allocation)
            if a.cpu_limit is not None:
                cap = min(cap, a.cpu_limit)
            per_node.setdefault(a.node, []).append((job_id, max(a.cpu_request, 1e-3), cap))
        out: dict[str, float] = {}
        for node, jobs in per_node.items():
            out.update(water_fill(max(0.0, self._nodes[node].cpu - self.background_at(self.now)), jobs))
        return out

    def background_at(self, t: float) -> float:
        """Cores busy outside the workload during the interval starting at `t`: the sample
        whose interval covers `t` (the last one after the samples end)."""
        i = bisect.bisect_right(self._background_ends, t)
        return self._background[min(i, len(self._background) - 1)][1]

    def _lose(self, node: str, t: float) -> None:
        self.node_losses += 1
        repair = self.failures.repair_s if self.failures else 0.0
        self._lost[node] = t + repair
        self._events.append(NodeLost(node, t, "injected failure"))
        for job_id in [j for j, r in self._runs.items() if node in r.allocation.nodes]:
            run = self._runs[job_id]
            model = self._models[job_id]
            if self.failures is not None:
                model.rollback(self.failures.lost_work_s())
            self._release(job_id)
            model.suspend()
            self._events.append(JobExited(job_id, run.attempt, t, -9, f"node lost: {node}", node_lost=True))

    def _repairs(self, t: float) -> None:
        for node, back in list(self._lost.items()):
            if back <= t:
                del self._lost[node]
                info = self._nodes[node]
                self._events.append(NodeUp(node, back, info.cpu, info.gpus, info.memory_mb, dict(info.labels)))

    # ----------------------------------------------------------------- GPU accounting

    def _take(self, new: Allocation, old: Allocation | None) -> None:
        delta: dict[str, int] = {}
        for n, g in new.gpus_per_node().items():
            delta[n] = delta.get(n, 0) + g
        if old is not None:
            for n, g in old.gpus_per_node().items():
                delta[n] = delta.get(n, 0) - g
        for n, g in delta.items():
            if n not in self._nodes:
                raise CapacityError(f"no node {n!r} in the simulated cluster")
            if self._gpu_used[n] + g > self._nodes[n].gpus:
                raise CapacityError(f"node {n} has {self._nodes[n].gpus - self._gpu_used[n]} GPUs free, asked for {g}")
        for n, g in delta.items():
            self._gpu_used[n] += g

    def _release(self, job_id: str) -> None:
        run = self._runs.pop(job_id)
        for n, g in run.allocation.gpus_per_node().items():
            self._gpu_used[n] -= g


def water_fill(capacity: float, jobs: list[tuple[str, float, float]]) -> dict[str, float]:
    """Split `capacity` among (id, weight, cap) in proportion to weight, never above cap,
    handing what a capped job cannot use to the others."""
    out: dict[str, float] = {}
    left = list(jobs)
    room = capacity
    while left and room > 1e-12:
        total_w = sum(w for _, w, _ in left)
        capped = [(j, w, c) for j, w, c in left if c <= room * w / total_w]
        if not capped:
            for j, w, _ in left:
                out[j] = room * w / total_w
            return out
        for j, _, c in capped:
            out[j] = c
            room -= c
        left = [x for x in left if x not in capped]
    for j, _, _ in left:
        out[j] = 0.0
    return out
