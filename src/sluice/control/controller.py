"""The controller: the only place where the store, the policy and the engine meet.

One reconcile round (`step`):
  1. poll the engine and apply its events to job records through the transition table
     (events of an older attempt, or for a job no longer active, are ignored — so a late
     or repeated event never moves a job backwards);
  2. admit pending jobs (tenant quotas);
  3. build an immutable ClusterView and ask the policy for decisions;
  4. execute each decision through the engine and record it, with its reason, in the
     job's event log — which is what `sluice job why` prints.

Every state change is written to the store before the round ends, so a crash loses at most
the round in flight; `recover()` rebuilds the rest from the store and the engine.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sluice.control.intents import StopIntent, get_intent, set_intent
from sluice.engine.base import Engine
from sluice.model import (
    Allocation,
    ClusterView,
    Decision,
    Event,
    IllegalTransition,
    JobCheckpointed,
    JobExited,
    JobProgress,
    JobRecord,
    JobStarted,
    JobUsage,
    JobView,
    LaunchRequest,
    Migrate,
    NodeCache,
    NodeHealth,
    NodeKPIs,
    NodeLost,
    NodeUp,
    NodeView,
    Phase,
    Place,
    Preempt,
    ProgressTracker,
    Resize,
    Wait,
)
from sluice.policy.base import Policy
from sluice.spec import JobSpec
from sluice.store.base import NodeRecord, Store

log = logging.getLogger("sluice.controller")

EventObserver = Callable[["Controller", list[Event]], None]
"""Called every round with that round's engine events (the health monitor is one)."""


@dataclass
class NodeState:
    """What the controller knows of a node beyond what the engine reports."""

    name: str
    cpu: float
    gpus: int = 0
    memory_mb: int = 0
    labels: dict[str, str] | None = None
    health: NodeHealth = NodeHealth.HEALTHY
    reason: str = ""
    cached: dict[str, float] | None = None
    cache_free_bytes: int = 0


class Controller:
    def __init__(
        self,
        store: Store,
        engine: Engine,
        policy: Policy,
        *,
        checkpoint_root: str,
        restart_backoff_s: float = 2.0,
        record_waits: bool = True,
        save_progress_every_s: float = 5.0,
        launch_env: Callable[[JobRecord], dict[str, str]] | None = None,
        dataset_bytes: Callable[[JobRecord], dict[str, int]] | None = None,
    ) -> None:
        """`launch_env` adds environment to every launch (where the job's datasets live);
        `dataset_bytes` sizes a job's datasets for data-aware placement (asked once per job)."""
        self.store = store
        self.engine = engine
        self.policy = policy
        self.checkpoint_root = checkpoint_root.rstrip("/")
        self.restart_backoff_s = restart_backoff_s
        self.record_waits = record_waits
        self.save_progress_every_s = save_progress_every_s
        self.jobs: dict[str, JobRecord] = {}
        """Every job this controller has seen; terminal ones are dropped from views."""
        self.active_ids: set[str] = set()
        """Ids of non-terminal jobs (what the view is built from)."""
        self.trackers: dict[str, ProgressTracker] = {}
        self.nodes: dict[str, NodeState] = {}
        self._node_views: dict[str, tuple[tuple[object, ...], NodeView]] = {}
        self.observers: list[EventObserver] = []
        self.lock = threading.RLock()
        self.round_seconds: float = 0.0
        """Wall time the last round took (for metrics and the scale benchmark)."""
        self.rounds = 0
        self.launches = 0
        """Launches so far; the reconcile loop runs a quick extra round after one."""
        self._dirty: set[str] = set()
        self._progressed: set[str] = set()
        """Jobs whose only change is progress: saved at most every save_progress_every_s."""
        self._last_saved: dict[str, float] = {}
        self._last_step_time: float | None = None
        self._launch_env = launch_env
        self._dataset_bytes = dataset_bytes
        self._sizes: dict[str, MappingProxyType[str, int]] = {}
        self._speedup = getattr(engine, "speedup_fn", None)
        self._hints = getattr(engine, "job_hints", None)
        self._refresh_nodes(self.engine.clock())

    # ----------------------------------------------------------------- user actions

    def submit(self, tenant: str, spec: JobSpec, job_id: str | None = None) -> JobRecord:
        """Accept a job. It is stored before this returns, so an accepted job is never lost."""
        with self.lock:
            now = self.engine.clock()
            job = JobRecord(
                id=job_id or f"j-{uuid.uuid4().hex[:10]}",
                tenant=tenant,
                spec=spec,
                phase=Phase.PENDING,
                reason="accepted; waiting for admission",
                submitted_at=now,
            )
            self.store.create_job(job)
            self._track(job)
            self._event(job, "phase", f"{Phase.PENDING}: submitted by tenant {tenant}")
            return job

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> JobRecord:
        with self.lock:
            job = self.jobs[job_id]
            if job.phase.terminal:
                return job
            if job.phase in (Phase.PENDING, Phase.QUEUED):
                self._move(job, Phase.CANCELLED, reason)
                self._finish(job)
            elif job.phase == Phase.STOPPING:
                set_intent(job, StopIntent("cancel", reason, asked_at=self.engine.clock()))
                self._save(job)
            else:
                self._stop(job, StopIntent("cancel", reason, asked_at=self.engine.clock()))
            return job

    def set_node_health(self, node: str, health: NodeHealth, reason: str, by: str = "detector") -> None:
        """Mark a node; a Cordoned (or Lost) node gets nothing new and its jobs are moved off
        through their checkpoints."""
        with self.lock:
            st = self.nodes.get(node)
            if st is None:
                raise KeyError(node)
            if st.health == health and st.reason == reason:
                return
            st.health, st.reason = health, reason
            now = self.engine.clock()
            self.store.save_node(NodeRecord(node, health, reason, by if health == NodeHealth.CORDONED else None, now))
            self.store.append_event(now, "node", f"{node} -> {health}: {reason}", node=node)
            if health in (NodeHealth.CORDONED, NodeHealth.LOST):
                for job in self._jobs_on(node):
                    if job.phase in (Phase.STARTING, Phase.RUNNING):
                        self._stop(job, StopIntent("preempt", f"node {node} {health.lower()}: {reason}", asked_at=now))

    # ----------------------------------------------------------------- the round

    def step(self) -> None:
        with self.lock:
            t0 = time.perf_counter()
            now = self.engine.clock()
            events = self.engine.poll()
            for e in events:
                self._apply(e, now)
            for obs in self.observers:
                obs(self, events)
            self._account_service(now)
            self._admit(now)
            view = self.view(now)
            decisions = self.policy.decide(view)
            for d in decisions:
                self._execute(d, now)
            self._flush(now)
            self.rounds += 1
            self.round_seconds = time.perf_counter() - t0

    def view(self, now: float | None = None) -> ClusterView:
        """The immutable snapshot the policy decides on."""
        now = self.engine.clock() if now is None else now
        nodes = {n.name: self._node_view(n) for n in self.nodes.values()}
        jobs: dict[str, JobView] = {}
        for jid in self.active_ids:
            job = self.jobs[jid]
            if job.phase == Phase.PENDING:
                continue
            jobs[jid] = self._job_view(job)
        return ClusterView(now=now, nodes=MappingProxyType(nodes), jobs=MappingProxyType(jobs))

    def _node_view(self, n: NodeState) -> NodeView:
        """A node's view, reused while nothing about the node changed: NodeViews are
        immutable, and rebuilding thousands of them every round dominated large simulations."""
        key = (
            n.cpu,
            n.gpus,
            n.memory_mb,
            n.health,
            n.reason,
            tuple(n.labels.items()) if n.labels else (),
            tuple(n.cached.items()) if n.cached else (),
            n.cache_free_bytes,
        )
        hit = self._node_views.get(n.name)
        if hit is not None and hit[0] == key:
            return hit[1]
        view = NodeView(
            name=n.name,
            cpu=n.cpu,
            gpus=n.gpus,
            memory_mb=n.memory_mb,
            labels=MappingProxyType(dict(n.labels or {})),
            health=n.health,
            health_reason=n.reason,
            cached_datasets=MappingProxyType(dict(n.cached or {})),
            cache_free_bytes=n.cache_free_bytes,
        )
        self._node_views[n.name] = (key, view)
        return view

    # ----------------------------------------------------------------- events

    def _apply(self, e: Event, now: float) -> None:
        if isinstance(e, NodeUp | NodeLost | NodeCache):
            self._apply_node(e, now)
            return
        if isinstance(e, NodeKPIs):
            return  # for observers (health monitor)
        job = self.jobs.get(e.job_id)
        if job is None or e.attempt != job.attempt or job.phase.terminal:
            return  # an older attempt, or a job we no longer manage: ignore
        if isinstance(e, JobStarted):
            if job.phase == Phase.STARTING:
                job.started_at = job.started_at or e.time
                self._move(job, Phase.RUNNING, f"process started on {e.node}" + (f" (pid {e.pid})" if e.pid else ""))
        elif isinstance(e, JobProgress):
            tr = self.trackers.setdefault(job.id, self._new_tracker(job))
            tr.report(e.time, e.step, e.loss, e.metrics)
            job.step, job.loss = tr.step, tr.loss
            self._check_qoe(job, e.time)
            self._progressed.add(job.id)
        elif isinstance(e, JobUsage):
            self.trackers.setdefault(job.id, self._new_tracker(job)).usage(e.time, e.cpu_cores)
        elif isinstance(e, JobCheckpointed):
            # Not logged as an event (jobs checkpoint often); the next placement names it.
            job.checkpoint = e.path
            job.extra["checkpoint_step"] = e.step
            self._progressed.add(job.id)
        elif isinstance(e, JobExited) and job.phase.active:
            self._on_exit(job, e, now)

    def _apply_node(self, e: NodeUp | NodeLost | NodeCache, now: float) -> None:
        if isinstance(e, NodeUp):
            st = self.nodes.get(e.node)
            if st is None:
                self.nodes[e.node] = NodeState(e.node, e.cpu, e.gpus, e.memory_mb, dict(e.labels))
                self.store.append_event(now, "node", f"{e.node} joined ({e.cpu:g} CPU, {e.gpus} GPU)", node=e.node)
            elif st.health == NodeHealth.LOST:
                st.health, st.reason = NodeHealth.HEALTHY, "node came back"
                st.cpu, st.gpus = e.cpu, e.gpus
                self.store.append_event(now, "node", f"{e.node} came back", node=e.node)
        elif isinstance(e, NodeLost):
            st = self.nodes.get(e.node)
            if st is None:
                return
            st.health, st.reason = NodeHealth.LOST, e.reason
            self.store.append_event(now, "node", f"{e.node} lost: {e.reason}", node=e.node)
            for job in self._jobs_on(e.node):
                # The engine will not hear from these processes again: requeue them now.
                set_intent(job, None)
                self._requeue(job, f"node {e.node} lost ({e.reason}); resuming from checkpoint", now, count=False)
        elif isinstance(e, NodeCache):
            st = self.nodes.get(e.node)
            if st is not None:
                st.cached, st.cache_free_bytes = dict(e.datasets), e.free_bytes

    def _on_exit(self, job: JobRecord, e: JobExited, now: float) -> None:
        intent = get_intent(job)
        set_intent(job, None)
        job.exit_code = e.exit_code
        code = f"exit code {e.exit_code}" + (f" ({e.reason})" if e.reason else "")
        if intent is not None and intent.kind == "cancel":
            self._move(job, Phase.CANCELLED, f"{intent.reason}; {code}")
            self._finish(job)
        elif e.exit_code == 0 and (intent is None or self._claims_done(job)):
            self._move(job, Phase.SUCCEEDED, "finished (exit code 0)")
            self._finish(job)
        elif intent is not None and intent.kind in ("preempt", "migrate"):
            took = now - intent.asked_at if intent.asked_at else 0.0
            job.extra["last_stop_s"] = round(took, 3)
            if intent.kind == "migrate" and intent.target is not None:
                self._requeue(job, f"stopped for migration after {took:.1f}s ({code})", now, count=False)
                self._launch(job, intent.target, f"migrate: {intent.reason}", now)
            else:
                self._requeue(job, f"preempted: {intent.reason} ({code}, stop took {took:.1f}s)", now, count=False)
        elif e.reason.startswith("node lost"):
            self._requeue(job, f"{code}; resuming from checkpoint", now, count=False)
        else:
            max_r = job.spec.max_restarts
            if job.restarts < max_r:
                job.restarts += 1
                backoff = self.restart_backoff_s * (2 ** (job.restarts - 1))
                self._requeue(
                    job,
                    f"{code}; retry {job.restarts}/{max_r} after {backoff:g}s back-off, resuming from checkpoint",
                    now,
                    count=False,
                    not_before=now + backoff,
                )
            else:
                job.exit_code = e.exit_code
                self._move(job, Phase.FAILED, f"{code}; gave up after {job.restarts} restart(s)")
                self._finish(job)

    def _claims_done(self, job: JobRecord) -> bool:
        """A job asked to stop that exits 0 has either checkpointed (resume it) or finished.
        It finished when it had reported its final step."""
        tr = self.trackers.get(job.id)
        return bool(tr and tr.total_steps and tr.step >= tr.total_steps)

    # ----------------------------------------------------------------- decisions

    def _execute(self, d: Decision, now: float) -> None:
        job = self.jobs.get(d.job_id)
        if job is None or job.phase.terminal:
            return
        try:
            if isinstance(d, Place):
                if job.phase == Phase.QUEUED and job.not_before <= now:
                    self._launch(job, d.allocation, d.reason, now)
            elif isinstance(d, Resize):
                if job.phase in (Phase.STARTING, Phase.RUNNING) and job.allocation is not None:
                    old = job.allocation.describe()
                    self.engine.resize(job.id, job.attempt, d.allocation)
                    job.allocation = d.allocation
                    self._event(
                        job,
                        "resize",
                        f"{d.reason} [{old} -> {d.allocation.describe()}]",
                        data={"allocation": d.allocation.to_list()},
                    )
            elif isinstance(d, Preempt):
                if job.phase in (Phase.STARTING, Phase.RUNNING):
                    self._stop(job, StopIntent("preempt", d.reason, asked_at=now))
            elif isinstance(d, Migrate):
                if job.phase in (Phase.STARTING, Phase.RUNNING):
                    self._stop(job, StopIntent("migrate", d.reason, d.allocation, asked_at=now))
            elif isinstance(d, Wait) and job.phase == Phase.QUEUED and job.reason != d.reason:
                job.reason = d.reason
                if self.record_waits:
                    self._event(job, "wait", d.reason)
                else:
                    self._dirty.add(job.id)
        except Exception as err:  # an engine failure must not stop the loop for other jobs
            log.exception("decision %s for %s failed", type(d).__name__, job.id)
            self._event(job, "error", f"{type(d).__name__} failed: {err}")

    def _launch(self, job: JobRecord, alloc: Allocation, reason: str, now: float) -> None:
        job.attempt += 1
        job.allocation = alloc
        job.not_before = 0.0
        self._move(job, Phase.STARTING, reason)
        resume = f"; resumes from checkpoint at step {job.extra.get('checkpoint_step')}" if job.checkpoint else ""
        self._event(
            job,
            "place",
            f"attempt {job.attempt} on {alloc.describe()}: {reason}{resume}",
            data={"allocation": alloc.to_list(), "attempt": job.attempt},
        )
        self._save(job)  # durable before the process exists: a crash now is recoverable
        req = LaunchRequest(
            job_id=job.id,
            attempt=job.attempt,
            tenant=job.tenant,
            spec=job.spec,
            allocation=alloc,
            checkpoint_dir=self.checkpoint_dir(job),
            env=self._launch_env(job) if self._launch_env and job.spec.datasets else {},
        )
        try:
            self.engine.launch(req)
            self.launches += 1
        except Exception as err:
            self._requeue(job, f"launch failed: {err}", now, count=True, not_before=now + self.restart_backoff_s)

    def _stop(self, job: JobRecord, intent: StopIntent) -> None:
        set_intent(job, intent)
        self._move(job, Phase.STOPPING, f"{intent.kind}: {intent.reason}")
        self._save(job)
        self.engine.stop(job.id, job.attempt, checkpoint=True)

    def _requeue(self, job: JobRecord, reason: str, now: float, *, count: bool, not_before: float = 0.0) -> None:
        if count:
            job.restarts += 1
            if job.restarts > job.spec.max_restarts:
                self._move(job, Phase.FAILED, f"{reason}; gave up after {job.restarts - 1} restart(s)")
                self._finish(job)
                return
        job.allocation = None
        job.not_before = not_before
        job.extra["requeues"] = int(job.extra.get("requeues", 0)) + 1  # type: ignore[call-overload]
        self._move(job, Phase.QUEUED, reason)

    # ----------------------------------------------------------------- helpers

    def checkpoint_dir(self, job: JobRecord) -> str:
        base = job.spec.checkpoint.location or self.checkpoint_root
        return f"{base.rstrip('/')}/{job.id}/checkpoints"

    def _admit(self, now: float) -> None:
        pending = [self.jobs[j] for j in self.active_ids if self.jobs[j].phase == Phase.PENDING]
        if not pending:
            return
        quotas = self._tenant_quotas()
        held: dict[str, int] = {}
        for jid in self.active_ids:
            j = self.jobs[jid]
            if j.phase != Phase.PENDING:
                held[j.tenant] = held.get(j.tenant, 0) + 1
        for job in sorted(pending, key=lambda j: (j.submitted_at, j.id)):
            limit = quotas.get(job.tenant)
            if limit is not None and held.get(job.tenant, 0) >= limit:
                reason = f"tenant {job.tenant} is at its quota of {limit} admitted job(s)"
                if job.reason != reason:
                    job.reason = reason
                    self._event(job, "wait", reason)
                continue
            held[job.tenant] = held.get(job.tenant, 0) + 1
            self._move(job, Phase.QUEUED, "admitted")

    def _tenant_quotas(self) -> dict[str, int]:
        return {t.name: t.max_running_jobs for t in self.store.list_tenants() if t.max_running_jobs is not None}

    def _account_service(self, now: float) -> None:
        last, self._last_step_time = self._last_step_time, now
        if last is None or now <= last:
            return
        dt = now - last
        for jid in self.active_ids:
            job = self.jobs[jid]
            if job.allocation is not None and job.phase in (Phase.STARTING, Phase.RUNNING):
                gpus = job.allocation.total_gpus
                job.attained_service += dt * (gpus if gpus else job.allocation.total_cpu_request)

    def _check_qoe(self, job: JobRecord, t: float) -> None:
        target = job.spec.qoe.loss if job.spec.qoe else None
        if target is not None and job.loss is not None and job.loss <= target and "qoe_met_at" not in job.extra:
            job.extra["qoe_met_at"] = t
            self._event(job, "qoe", f"reached loss target {target:g} at step {job.step}", save=False)

    def _job_view(self, job: JobRecord) -> JobView:
        spec = job.spec
        res = spec.resources
        tr = self.trackers.get(job.id)
        qoe = spec.qoe
        deadline = None
        if qoe is not None:
            if qoe.deadline_s is not None:
                deadline = job.submitted_at + qoe.deadline_s
            elif qoe.deadline is not None:
                deadline = qoe.deadline.timestamp()
        hints: dict[str, Any] = dict(self._hints(job.id)) if self._hints else {}
        if job.not_before:
            hints["not_before"] = job.not_before
        return JobView(
            id=job.id,
            tenant=job.tenant,
            name=spec.name,
            phase=job.phase,
            submitted_at=job.submitted_at,
            priority=spec.priority,
            queue=spec.queue,
            cpu_min=res.cpu.min,
            cpu_max=res.cpu.max,
            memory_mb=res.memory_mb,
            gpus=res.gpus,
            replicas_min=res.replicas.min,
            replicas_max=res.replicas.max or res.replicas.min,
            allocation=job.allocation,
            started_at=job.started_at,
            restarts=job.restarts,
            attained_service=job.attained_service,
            progress=tr.snapshot() if tr else _EMPTY_PROGRESS,
            qoe_loss=qoe.loss if qoe else None,
            qoe_deadline=deadline,
            datasets=tuple(d.name for d in spec.datasets),
            dataset_bytes=self._sizes_of(job),
            speedup=self._speedup(job.id) if self._speedup else None,
            hints=MappingProxyType(hints),
        )

    def _sizes_of(self, job: JobRecord) -> MappingProxyType[str, int]:
        if not job.spec.datasets or self._dataset_bytes is None:
            return _NO_SIZES
        if job.id not in self._sizes:
            self._sizes[job.id] = MappingProxyType(self._dataset_bytes(job))
        return self._sizes[job.id]

    def _new_tracker(self, job: JobRecord) -> ProgressTracker:
        tr = ProgressTracker()
        if job.spec.qoe and job.spec.qoe.loss is not None:
            tr.loss_target = job.spec.qoe.loss
        return tr

    def _jobs_on(self, node: str) -> list[JobRecord]:
        return [
            self.jobs[j]
            for j in list(self.active_ids)
            if self.jobs[j].phase.active
            and self.jobs[j].allocation is not None
            and node in self.jobs[j].allocation.nodes  # type: ignore[union-attr]
        ]

    def _refresh_nodes(self, now: float) -> None:
        saved = {n.name: n for n in self.store.list_nodes()}
        for info in self.engine.nodes():
            if info.name not in self.nodes:
                st = NodeState(info.name, info.cpu, info.gpus, info.memory_mb, dict(info.labels))
                rec = saved.get(info.name)
                if rec is not None and rec.health == NodeHealth.CORDONED:
                    st.health, st.reason = rec.health, rec.reason
                self.nodes[info.name] = st

    def _track(self, job: JobRecord) -> None:
        self.jobs[job.id] = job
        if job.phase.terminal:
            self.active_ids.discard(job.id)
        else:
            self.active_ids.add(job.id)

    def _move(self, job: JobRecord, dst: Phase, reason: str) -> None:
        src = job.phase
        try:
            job.move(dst, reason)
        except IllegalTransition:
            log.warning("ignored illegal transition %s -> %s for %s", src, dst, job.id)
            return
        if src != dst:
            self._event(job, "phase", f"{src} -> {dst}: {reason}", data={"from": str(src), "to": str(dst)})

    def _finish(self, job: JobRecord) -> None:
        job.finished_at = self.engine.clock()
        self.active_ids.discard(job.id)
        self._save(job)
        self.trackers.pop(job.id, None)
        self._sizes.pop(job.id, None)

    def _event(
        self, job: JobRecord, kind: str, message: str, data: dict[str, Any] | None = None, save: bool = True
    ) -> None:
        self.store.append_event(self.engine.clock(), kind, message, job_id=job.id, data=data)
        if save:
            self._dirty.add(job.id)

    def _save(self, job: JobRecord) -> None:
        self.store.save_job(job)
        self._dirty.discard(job.id)
        self._last_saved[job.id] = self.engine.clock()

    def _flush(self, now: float) -> None:
        for jid in list(self._progressed):
            if now - self._last_saved.get(jid, 0.0) >= self.save_progress_every_s:
                self._dirty.add(jid)
        for jid in list(self._dirty):
            job = self.jobs.get(jid)
            if job is not None:
                self._save(job)
            self._progressed.discard(jid)
        self._dirty.clear()

    # ----------------------------------------------------------------- recovery

    def load(self, jobs: Iterable[JobRecord]) -> None:
        for job in jobs:
            self._track(job)


_EMPTY_PROGRESS = ProgressTracker().snapshot()
_NO_SIZES: MappingProxyType[str, int] = MappingProxyType({})


__all__ = ["Controller", "NodeState"]
