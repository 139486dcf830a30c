"""The controller: the reconcile round and nothing else.

One round (`step`):
  1. observe — poll the engine and apply its events to the jobs through the job book
     (events of an older attempt, or for a job no longer live, are ignored, so a late or
     repeated event never moves a job backwards);
  2. admit pending jobs (tenant quotas);
  3. decide — build the immutable ClusterView; the policy returns job decisions and the
     round's observers (the health monitor) return node decisions, each with its reason;
  4. execute — carry each decision out through the engine and record it in the book. A
     decision the engine cannot carry out (see `EngineCapabilities`) is refused, with the
     reason, before anything is recorded.

Faults are contained: an exception while handling one job fails that job, with the error as
its reason, and the round goes on for everyone else. A store that cannot take writes
(`StoreUnavailable`) ends the round instead: nothing half-done was recorded, the engine
events not yet applied are kept, and the next round starts with them.

Every state change goes through `JobBook` (control/book.py), the only writer of job state.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Protocol

from sluice.control import confine
from sluice.control.book import JobBook
from sluice.control.failpoints import Failpoints
from sluice.engine.base import Engine
from sluice.model import (
    Allocation,
    ClusterView,
    Decision,
    Event,
    JobCheckpointed,
    JobExited,
    JobProgress,
    JobRecord,
    JobStarted,
    JobUsage,
    JobUser,
    JobView,
    LaunchRequest,
    Migrate,
    NodeCache,
    NodeDecision,
    NodeHealth,
    NodeKPIs,
    NodeLost,
    NodeUp,
    NodeView,
    OracleSource,
    Phase,
    Place,
    Preempt,
    ProgressSignals,
    ProgressTracker,
    Resize,
    SetNodeHealth,
    StopIntent,
    StopKind,
    Wait,
    alloc_shape,
)
from sluice.model.phase import TERMINAL as TERMINAL_PHASES
from sluice.model.queue import DEFAULT_QUEUE, Amounts, QueueConfig
from sluice.policy import admission
from sluice.policy.base import Policy
from sluice.spec import JobSpec
from sluice.store.base import HeldTime, NodeRecord, Store, StoreUnavailable, TenantRecord, hour_of

log = logging.getLogger("sluice.controller")


JobEvent = JobStarted | JobProgress | JobUsage | JobCheckpointed | JobExited


REASON_CLASSES = ("policy", "quota", "engine_refused", "detector", "operator", "other")
"""Why a decision was made, as a fixed category: the policy chose it, admission took quota
back, the engine could not carry it out, the health detector or an operator changed a node."""


class RoundObserver(Protocol):
    """Something that watches every round and may ask for node changes (the health monitor).
    It sees the round's view and engine events and returns decisions; it never acts."""

    def observe(self, view: ClusterView, events: Sequence[Event]) -> Sequence[NodeDecision]: ...


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


_ARRAY_TURN_PHASES = frozenset({Phase.QUEUED, Phase.STARTING, Phase.RUNNING, Phase.STOPPING})
"""The phases in which a job of an array takes one of its `parallel` turns: admitted, holding
quota (a Stopping job still holds its node until it exits)."""

DISK_USE_TTL_S = 30.0
"""How old the sum of a tenant's ended jobs' disk use may be when its `max_disk_mb` is
checked (one grouped read of the jobs table, only while a capped tenant has pending jobs); a
job ending adds its disk to it without a read, a delete has it read at the next round, a
retention pass within this."""


def array_count(book: JobBook, array_id: str, tenant: str) -> int | None:
    """How many jobs the array `array_id` of `tenant` has (its first job says), or None when
    `tenant` has no such array: another tenant's reads as none."""
    first = book.get(f"{array_id}-0")
    if first is None or first.tenant != tenant or first.spec.array is None or first.spec.array.id != array_id:
        return None
    return first.spec.array.count


def _started_where(job: JobRecord, e: JobStarted) -> str:
    """The Running reason: where the job's processes started. A gang's are on every node of its
    allocation (the event comes from rank 0's, whose node it names): `2 replicas started on n1,
    n2 (rank 0: pid 41)`, not rank 0's node alone."""
    if job.allocation is None or job.allocation.replicas <= 1:
        return f"process started on {e.node}" + (f" (pid {e.pid})" if e.pid else "")
    pid = f" (rank 0: pid {e.pid})" if e.pid else ""
    return f"{job.allocation.replicas} replicas started on {', '.join(job.allocation.nodes)}{pid}"


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
        failpoints: Failpoints | None = None,
        run_as: Callable[[str], JobUser] | None = None,
        preempt_min_runtime_s: float = 60.0,
        oracle: OracleSource | None = None,
    ) -> None:
        """`launch_env` adds environment to every launch (where the job's datasets live);
        `dataset_bytes` sizes a job's datasets for data-aware placement (asked once per job);
        `preempt_min_runtime_s`: admission never preempts a job placed less than this ago;
        `oracle` hands policies a simulator's ground truth (upper-bound studies only: a real
        engine has none, and a view carries none unless it is given here)."""
        self.store = store
        self.engine = engine
        self.policy = policy
        self.book = JobBook(
            store,
            engine.clock,
            failpoints=failpoints,
            save_progress_every_s=save_progress_every_s,
            record_waits=record_waits,
        )
        self.checkpoint_root = checkpoint_root.rstrip("/")
        self.restart_backoff_s = restart_backoff_s
        self.lock = threading.RLock()
        """Held for a whole round and for every user action: one writer at a time."""
        self.round_seconds: float = 0.0
        """Wall time the last round took (for metrics and the scale benchmark)."""
        self.rounds = 0
        self.launches = 0
        """Launches so far; the reconcile loop runs a quick extra round after one."""
        self.decisions: dict[str, int] = {}
        """Decisions executed so far, by kind (Place, Resize, ..., refused)."""
        self.decision_reasons: dict[tuple[str, str], int] = {}
        """Decisions so far by (kind, reason class): the class is one of REASON_CLASSES, never
        the free-text reason, so a metrics label made of it stays bounded."""
        self._nodes: dict[str, NodeState] = {}
        self._node_views: dict[str, tuple[tuple[object, ...], NodeView]] = {}
        self._observers: list[RoundObserver] = []
        self._trackers: dict[str, ProgressTracker] = {}
        self._backlog: list[Event] = []
        self._last_step_time: float | None = None
        self._held: dict[tuple[str, float, bool], list[float]] = {}
        """Held time not yet written: (tenant, hour, gpu) -> [service_s, run_s, cpu_used_s]
        (flush_held_time)."""
        self._held_saved_at = 0.0
        self._cpu_readings: dict[str, tuple[int, float, float]] = {}
        """job id -> (attempt, CPU-seconds, time) of its newest JobUsage not yet counted: counted
        with the round's run time (one record change a job a round, not one per reading)."""
        self._launch_env = launch_env
        self._run_as = run_as
        """tenant -> the uid its jobs run as (tenant isolation); None: the agent's own user."""
        self._dataset_bytes = dataset_bytes
        self._sizes: dict[str, MappingProxyType[str, int]] = {}
        self._oracle = oracle
        self.preempt_min_runtime_s = preempt_min_runtime_s
        self._placed_at: dict[str, float] = {}
        """When each job's current attempt was placed (admission's preemption rate limit)."""
        self._stalls: dict[str, str] = {}
        """Admitted jobs that could preempt to make room but may not, and why (admission's
        `Stall`, this round): added to the reason the policy gives for their wait."""
        self._after_met: set[str] = set()
        """Pending jobs whose predecessors (`spec.after`, `spec.after_any`) are all done: never held again."""
        self._after_done: dict[str, set[str]] = {}
        """Per pending job held for its predecessors, those seen done (Succeeded; any end for after_any)."""
        self._after_of: dict[str, list[tuple[str, bool]]] = {}
        """Per pending job held for its predecessors, the jobs it names (arrays expanded, once),
        each with whether any end will do (`after_any`)."""
        self._round_queues: dict[str, QueueConfig] | None = None
        """The queues as this round read them (`_queues_this_round`); None until it does."""
        self._ended_disk: tuple[float, dict[str, float], dict[str, float]] = (-math.inf, {}, {})
        """(monotonic time first read, per tenant `book.ended_disk_mb` when read, per tenant MiB
        its ended jobs' run folders held as read): `_ended_disk_mb`."""
        self._refresh_nodes()

    # ----------------------------------------------------------------- reads

    def node(self, name: str) -> NodeState | None:
        """A copy of what the controller knows of a node (None if unknown)."""
        st = self._nodes.get(name)
        return None if st is None else replace(st)

    def node_names(self) -> list[str]:
        return list(self._nodes)

    def progress(self, job_id: str) -> ProgressSignals | None:
        """A live job's progress signals as policies see them (None before its first report)."""
        tr = self._trackers.get(job_id)
        return tr.snapshot() if tr else None

    def add_observer(self, observer: RoundObserver) -> None:
        self._observers.append(observer)

    def saved_nodes(self) -> list[NodeRecord]:
        """Node health as persisted (what an observer starting up resumes from)."""
        return self.store.list_nodes()

    # ----------------------------------------------------------------- user actions

    def submit(self, tenant: str, spec: JobSpec, job_id: str | None = None) -> JobRecord:
        """Accept a job. It is on disk before this returns, so an accepted job is never lost."""
        with self.lock:
            return self.book.create(tenant, spec, job_id=job_id)

    def submit_many(self, tenant: str, specs: list[tuple[JobSpec, str]]) -> list[JobRecord]:
        """Accept several jobs (spec, id) at once: all on disk before this returns, or none."""
        with self.lock:
            return self.book.create_many(tenant, specs)

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> JobRecord:
        """Cancel a job: at once if it holds nothing, else through a checkpointing stop whose
        exit ends it as Cancelled. Cancelling a Stopping job turns its stop into a cancel."""
        with self.lock:
            job = self.book.get(job_id)
            if job is None:
                raise KeyError(job_id)
            if job.phase.terminal:
                return job
            self.book.adopt(job)
            if job.phase in (Phase.PENDING, Phase.QUEUED, Phase.SUSPENDED):
                return self.book.transition(job_id, Phase.CANCELLED, reason)
            intent = StopIntent(StopKind.CANCEL, reason, asked_at=self.engine.clock())
            if job.phase == Phase.STOPPING:
                return self.book.update(job_id, "cancel", f"cancel while stopping: {reason}", stop_intent=intent)
            return self._stop(job, intent)

    def suspend(self, job_id: str, reason: str = "suspended by user") -> JobRecord:
        """Suspend a job: it gives its quota back and stays Suspended, with its checkpoint,
        until resumed. A running job checkpoints and stops first (a SUSPEND stop intent)."""
        with self.lock:
            job = self.book.get(job_id)
            if job is None:
                raise KeyError(job_id)
            if job.phase in (Phase.SUSPENDED, *TERMINAL_PHASES) or (
                job.stop_intent is not None and job.stop_intent.kind == StopKind.SUSPEND
            ):
                return job
            self.book.adopt(job)
            if job.phase in (Phase.PENDING, Phase.QUEUED):
                return self.book.transition(job_id, Phase.SUSPENDED, reason)
            intent = StopIntent(StopKind.SUSPEND, reason, asked_at=self.engine.clock())
            if job.phase == Phase.STOPPING:
                if job.stop_intent is not None and job.stop_intent.kind in (StopKind.CANCEL, StopKind.TIME_LIMIT):
                    return job  # a cancel, or the end of its time, outranks a suspend
                return self.book.update(job_id, "suspend", f"suspend while stopping: {reason}", stop_intent=intent)
            return self._stop(job, intent)

    def resume(self, job_id: str, reason: str = "resumed by user") -> JobRecord:
        """Resume a Suspended job: back to admission, and from its checkpoint when placed."""
        with self.lock:
            job = self.book.get(job_id)
            if job is None:
                raise KeyError(job_id)
            if job.phase != Phase.SUSPENDED:
                return job
            self.book.adopt(job)
            return self.book.transition(job_id, Phase.PENDING, reason)

    def set_node_health(self, node: str, health: NodeHealth, reason: str, by: str = "detector") -> None:
        """Mark a node; a Cordoned (or Lost) node gets nothing new and its jobs are moved off
        through their checkpoints. KeyError for an unknown node."""
        with self.lock:
            self._execute_node(SetNodeHealth(node, health, reason, by))

    # ----------------------------------------------------------------- the round

    def step(self) -> None:
        with self.lock:
            t0 = time.perf_counter()
            now = self.engine.clock()
            # Events kept from a round the store refused are retried alone: polling again would
            # tell the engine they were stored (a node agent marks an exit reported at its next
            # poll), and a crash before the store took them would lose them. The engine keeps
            # what happens meanwhile until the round after they are stored.
            events = self._backlog if self._backlog else self.engine.poll()
            self._backlog, self._round_queues = [], None
            self.apply_events(events, now)
            self._account_service(now)
            self._hold_to_time_limits(now)
            self._admit()
            view = self.view(now)
            node_decisions = self._observe(view, events)
            for nd in node_decisions:
                self._execute_node(nd)
            if node_decisions:
                view = self.view(now)
            try:
                decisions = self.policy.decide(view)
            except Exception:  # a policy bug must not stop the cluster; it is logged in full
                log.exception("policy %s failed this round", self.policy.name)
                decisions = []
            for d in decisions:
                self._execute(d, now)
            self.book.flush()
            self.flush_held_time()
            self.rounds += 1
            self.round_seconds = time.perf_counter() - t0

    def apply_events(self, events: list[Event], now: float) -> None:
        """Apply engine events in order. If the store stops taking writes, the events not yet
        applied (the failed one included) are kept for the next round and the error raised."""
        for i, e in enumerate(events):
            try:
                self._apply(e, now)
            except StoreUnavailable:
                self._backlog = events[i:] + self._backlog
                raise
            except Exception as err:
                job_id = e.job_id if isinstance(e, JobEvent) else None
                self._contain(job_id, f"handling {type(e).__name__}", err)

    def view(self, now: float | None = None) -> ClusterView:
        """The immutable snapshot the policy decides on."""
        now = self.engine.clock() if now is None else now
        nodes = {n.name: self._node_view(n) for n in self._nodes.values()}
        jobs: dict[str, JobView] = {}
        for job in self.book.live():
            if job.phase in (Phase.PENDING, Phase.SUSPENDED):
                continue
            try:
                jobs[job.id] = self._job_view(job)
            except StoreUnavailable:
                raise
            except Exception as err:
                self._contain(job.id, "building its view", err)
        return ClusterView(
            now=now,
            nodes=MappingProxyType(nodes),
            jobs=MappingProxyType(jobs),
            capabilities=self.engine.capabilities,
        )

    def _observe(self, view: ClusterView, events: Sequence[Event]) -> list[NodeDecision]:
        out: list[NodeDecision] = []
        for obs in self._observers:
            try:
                out.extend(obs.observe(view, events))
            except Exception:
                log.exception("round observer %s failed", type(obs).__name__)
        return out

    def _contain(self, job_id: str | None, doing: str, err: Exception) -> None:
        """One job's fault fails that job, with the error as its reason; the round goes on."""
        log.exception("internal error %s for job %s", doing, job_id)
        if job_id is None or not self.book.is_live(job_id):
            return
        job = self.book.get(job_id)
        assert job is not None
        reason = f"internal error {doing}: {type(err).__name__}: {err}"
        # The store may refuse the record itself (a value a report put in it): then the record
        # it last took is failed instead, without what was observed since.
        if not self._fail_contained(job_id, reason) and not (
            self.book.revert_to_stored(job_id)
            and self._fail_contained(job_id, f"{reason} (its unsaved progress was dropped)")
        ):
            return
        if job.phase.active:
            self._engine_call(job, "stop", lambda: self.engine.stop(job.id, job.attempt, checkpoint=False))
        self._forget(job_id)

    def _fail_contained(self, job_id: str, reason: str) -> bool:
        """Move a job in fault to Failed; False (logged) where its record could not be written."""
        try:
            self.book.transition(job_id, Phase.FAILED, reason)
        except StoreUnavailable:
            raise
        except Exception:
            log.exception("could not fail job %s after an internal error", job_id)
            return False
        return True

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
        job = self.book.get(e.job_id) if self.book.is_live(e.job_id) else None
        if job is None or e.attempt != job.attempt:
            return  # an older attempt, or a job no longer live: ignore
        if isinstance(e, JobStarted):
            if job.phase == Phase.STARTING:
                where = _started_where(job, e)
                self.book.transition(job.id, Phase.RUNNING, where, started_at=job.started_at or e.time)
        elif isinstance(e, JobProgress):
            tr = self._tracker(job)
            tr.report(e.time, e.step, e.loss, e.metrics, shape=alloc_shape(job.allocation), attempt=job.attempt)
            self.book.observe(job.id, step=tr.attempt_step, loss=tr.loss)
            self._check_qoe(job, tr, e.time)
        elif isinstance(e, JobUsage):
            self._tracker(job).usage(e.time, e.cpu_cores)
            if e.cpu_s is not None:
                self._cpu_readings[job.id] = (e.attempt, e.cpu_s, e.time)
            if e.disk_mb is not None and e.attempt == job.attempt and e.disk_mb != job.disk_mb:
                self.book.observe(job.id, disk_mb=e.disk_mb)
        elif isinstance(e, JobCheckpointed):
            # Not logged as an event (jobs checkpoint often); the next placement names it.
            self.book.observe(job.id, checkpoint=e.path, checkpoint_step=e.step)
        elif isinstance(e, JobExited) and job.phase.active:
            if self._last_step_time is None:
                # A plane starting up: it ran on while none counted, until it exited (adopt_running's).
                job, _ = self._charge_unwatched(job, min(e.time, now))
            self._on_exit(job, e, now)

    def _apply_node(self, e: NodeUp | NodeLost | NodeCache, now: float) -> None:
        if isinstance(e, NodeUp):
            st = self._nodes.get(e.node)
            if st is None:
                self._nodes[e.node] = NodeState(e.node, e.cpu, e.gpus, e.memory_mb, dict(e.labels))
                self.store.append_event(now, "node", f"{e.node} joined ({e.cpu:g} CPU, {e.gpus} GPU)", node=e.node)
            elif st.health == NodeHealth.LOST:
                # A cordon outlives the loss (the store keeps it; a loss is not saved there):
                # the node comes back cordoned, as a plane that starts up finds it.
                saved = next((n for n in self.store.list_nodes() if n.name == e.node), None)
                if saved is not None and saved.health == NodeHealth.CORDONED:
                    st.health, st.reason = NodeHealth.CORDONED, saved.reason
                else:
                    st.health, st.reason = NodeHealth.HEALTHY, "node came back"
                st.cpu, st.gpus = e.cpu, e.gpus
                st.labels = {**(st.labels or {}), **e.labels}
                self.store.append_event(now, "node", f"{e.node} came back", node=e.node)
            else:
                # A live node's engine learned more about it (a Ray node's agent answered).
                st.labels = {**(st.labels or {}), **e.labels}
        elif isinstance(e, NodeLost):
            st = self._nodes.get(e.node)
            if st is None:
                return
            st.health, st.reason = NodeHealth.LOST, e.reason
            self.store.append_event(now, "node", f"{e.node} lost: {e.reason}", node=e.node)
            for job in self._jobs_on(e.node):
                # The engine will not hear from these processes again: requeue them now, or
                # end them as the cancel they were being stopped for.
                self._after_process_gone(job, f"node {e.node} lost ({e.reason})", now)
        elif isinstance(e, NodeCache):
            st = self._nodes.get(e.node)
            if st is not None:
                st.cached, st.cache_free_bytes = dict(e.datasets), e.free_bytes

    def _on_exit(self, job: JobRecord, e: JobExited, now: float) -> None:
        used = self._cpu_used(job)  # its last reading (it comes just before the exit) counted
        if used:
            job = self.book.observe(job.id, **used) or job
        intent = job.stop_intent
        code = f"exit code {e.exit_code}" + (f" ({e.reason})" if e.reason else "")
        if e.oom is not None:  # the typed fact leads: "OOMKilled: exceeded memory limit ..."
            code = f"{e.oom}; {code}"
        if intent is not None and intent.kind == StopKind.CANCEL:
            self._finish(job, Phase.CANCELLED, f"{intent.reason}; {code}", exit_code=e.exit_code)
        elif e.exit_code == 0 and (intent is None or self._claims_done(job)):
            self._finish(job, Phase.SUCCEEDED, "finished (exit code 0)", exit_code=0)
        elif intent is not None and intent.kind == StopKind.TIME_LIMIT:
            self._finish(job, Phase.FAILED, f"time limit: {intent.reason}; {code}", exit_code=e.exit_code)
        elif intent is not None:
            took = round(now - intent.asked_at, 3) if intent.asked_at else 0.0
            if intent.kind == StopKind.SUSPEND:
                self._suspended(job, f"{intent.reason} ({code}, stop took {took:.1f}s)", exit_code=e.exit_code)
            elif intent.kind == StopKind.MIGRATE and intent.target is not None:
                self._tracker(job).restarting()
                queued = self._requeue(
                    job, f"stopped for migration after {took:.1f}s ({code})", exit_code=e.exit_code, last_stop_s=took
                )
                self._place(queued, intent.target, f"migrate: {intent.reason}", now)
            elif intent.kind == StopKind.RESIZE and intent.target is not None:
                # Not a failure: `restarts` is untouched, the relaunch resumes from the checkpoint.
                self._tracker(job).restarting()
                queued = self._requeue(
                    job, f"stopped for resize after {took:.1f}s ({code})", exit_code=e.exit_code, last_stop_s=took
                )
                self._place(queued, intent.target, f"resized {intent.reason}", now)
            else:
                self._requeue(
                    job,
                    f"preempted: {intent.reason} ({code}, stop took {took:.1f}s)",
                    exit_code=e.exit_code,
                    last_stop_s=took,
                )
        elif e.node_lost:
            self._requeue(job, f"{code}; resuming from checkpoint", exit_code=e.exit_code)
        elif not e.retryable:
            self._finish(
                job, Phase.FAILED, f"{code}; not retried: every attempt would fail the same way", exit_code=e.exit_code
            )
        else:
            self._retry_or_fail(job, code, now, exit_code=e.exit_code)

    def _retry_or_fail(self, job: JobRecord, why: str, now: float, **changes: Any) -> None:
        """A failed attempt: retried with back-off while restarts remain, else the job fails.
        The restart count is written with the requeue, so it survives any crash."""
        max_r = job.spec.max_restarts
        if job.restarts < max_r:
            restarts = job.restarts + 1
            backoff = self.restart_backoff_s * (2 ** (restarts - 1))
            self._requeue(
                job,
                f"{why}; retry {restarts}/{max_r} after {backoff:g}s back-off, resuming from checkpoint",
                restarts=restarts,
                not_before=now + backoff,
                **changes,
            )
        else:
            self._finish(job, Phase.FAILED, f"{why}; gave up after {job.restarts} restart(s)", **changes)

    def _after_process_gone(self, job: JobRecord, why: str, now: float) -> None:
        """A live job whose process is gone without an exit we saw (node lost, or it ended
        while the control plane was down with no exit code kept). A cancel stays a cancel;
        anything else resumes from its checkpoint."""
        intent = job.stop_intent
        if intent is not None and intent.kind == StopKind.CANCEL:
            self._finish(job, Phase.CANCELLED, f"{intent.reason}; {why}")
        elif intent is not None and intent.kind == StopKind.TIME_LIMIT:
            self._finish(job, Phase.FAILED, f"time limit: {intent.reason}; {why}")
        elif intent is not None and intent.kind == StopKind.SUSPEND:
            self._suspended(job, f"{intent.reason}; {why}")
        else:
            self._requeue(job, f"{why}; resuming from checkpoint")

    def _suspended(self, job: JobRecord, reason: str, **changes: Any) -> None:
        """A job stopped for a suspend: it keeps its checkpoint and holds nothing."""
        self.book.transition(
            job.id, Phase.SUSPENDED, f"suspended: {reason}", allocation=None, stop_intent=None, **changes
        )
        self._placed_at.pop(job.id, None)

    def _claims_done(self, job: JobRecord) -> bool:
        """A job asked to stop that exits 0 has either checkpointed (resume it) or finished.
        It finished when it had reported its final step."""
        tr = self._trackers.get(job.id)
        return bool(tr and tr.total_steps and tr.step >= tr.total_steps)

    # ----------------------------------------------------------------- decisions

    def _execute(self, d: Decision, now: float) -> None:
        job = self.book.get(d.job_id) if self.book.is_live(d.job_id) else None
        if job is None:
            return
        try:
            refusal = self._refusal(d, job)
            if refusal is not None:
                self._refuse(job, d, refusal)
                return
            d = self._under_the_ceiling(job, d)
            if isinstance(d, Resize) and d.allocation == job.allocation:
                return  # lifting a limit to the ceiling it already has: nothing to do, nothing to log
            if isinstance(d, Place):
                if job.phase == Phase.QUEUED and job.not_before <= now:
                    self._place(job, d.allocation, d.reason, now)
            elif isinstance(d, Resize):
                if job.phase in (Phase.STARTING, Phase.RUNNING) and job.allocation is not None:
                    if self._restarts_to_resize(job.allocation, d.allocation):
                        self._stop(job, self._resize_intent(job.allocation, d, now))
                    else:
                        self._resize(job, d)
            elif isinstance(d, Preempt):
                if job.phase in (Phase.STARTING, Phase.RUNNING):
                    self._stop(job, StopIntent(StopKind.PREEMPT, d.reason, asked_at=now))
            elif isinstance(d, Migrate):
                if job.phase in (Phase.STARTING, Phase.RUNNING):
                    self._stop(job, StopIntent(StopKind.MIGRATE, d.reason, d.allocation, asked_at=now))
            elif isinstance(d, Wait) and job.phase == Phase.QUEUED:
                stall = self._stalls.get(job.id)
                self.book.wait(job.id, f"{d.reason}; {stall}" if stall else d.reason)
                return
            self._count(type(d).__name__, "policy")
        except StoreUnavailable:
            raise
        except Exception as err:
            self._contain(job.id, f"executing {type(d).__name__}", err)

    def _count(self, kind: str, reason_class: str) -> None:
        """Count an executed decision by kind and by (kind, reason class) for metrics."""
        self.decisions[kind] = self.decisions.get(kind, 0) + 1
        key = (kind, reason_class)
        self.decision_reasons[key] = self.decision_reasons.get(key, 0) + 1

    def _refusal(self, d: Decision, job: JobRecord) -> str | None:
        """Why the engine cannot carry `d` out, or None if it can."""
        caps = self.engine.capabilities
        name = self.engine.name
        if isinstance(d, Place | Migrate):
            n = d.allocation.replicas
            if n > caps.max_replicas or (n > 1 and not caps.gang_launch):
                return f"the {name} engine cannot run {n} replicas of one job (at most {caps.max_replicas})"
        if isinstance(d, Migrate) and not caps.migration:
            return f"the {name} engine cannot migrate jobs"
        if isinstance(d, Resize) and job.allocation is not None:
            old, new = job.allocation, d.allocation
            if self._restarts_to_resize(old, new):
                return self._elastic_refusal(job, new)
            shape_changed = old.replicas != new.replicas or old.gpus_per_node() != new.gpus_per_node()
            if shape_changed and not caps.gpu_resize:
                return (
                    f"the {name} engine cannot change a running job's GPUs in place "
                    f"({old.describe()} -> {new.describe()}); only its number of replicas, by a checkpointed restart"
                )
            if not shape_changed and not caps.live_cpu_resize:
                return f"the {name} engine cannot change a running job's CPU limit in place"
        return None

    def _restarts_to_resize(self, old: Allocation, new: Allocation) -> bool:
        """A change of replica count cannot be made to running processes (the world size is
        fixed when a process group forms): on an engine without in-place GPU resizes (every
        real one) it is a checkpointed stop and a relaunch at the new size."""
        return old.replicas != new.replicas and not self.engine.capabilities.gpu_resize

    def _elastic_refusal(self, job: JobRecord, new: Allocation) -> str | None:
        """Why a restarting resize to `new` cannot be carried out, or None: it must stay in
        the spec's `resources.replicas` range, and the engine must be able to stop a job
        through its checkpoint and launch that many replicas."""
        caps, name = self.engine.capabilities, self.engine.name
        rng = job.spec.resources.replicas
        lo, hi, n = rng.min, rng.max or rng.min, new.replicas
        if not lo <= n <= hi:
            return f"{n} replicas is outside the spec's resources.replicas range [{lo}, {hi}]"
        if not caps.migration:
            return f"the {name} engine cannot restart a job from its checkpoint at a new size"
        if n > caps.max_replicas or (n > 1 and not caps.gang_launch):
            return f"the {name} engine cannot run {n} replicas of one job (at most {caps.max_replicas})"
        return None

    def _resize_intent(self, old: Allocation, d: Resize, now: float) -> StopIntent:
        """The stop that carries an elastic resize; its reason is what `sluice job why` shows
        when the job is relaunched: "resized 2 → 1 replicas: <policy's reason>"."""
        why = f"{old.replicas} → {d.allocation.replicas} replicas: {d.reason}"
        return StopIntent(StopKind.RESIZE, why, d.allocation, asked_at=now)

    def _refuse(self, job: JobRecord, d: Decision, why: str) -> None:
        msg = f"refused {type(d).__name__}: {why} (policy's reason: {d.reason})"
        self.decisions["refused"] = self.decisions.get("refused", 0) + 1
        key = (type(d).__name__, "engine_refused")
        self.decision_reasons[key] = self.decision_reasons.get(key, 0) + 1
        if job.phase == Phase.QUEUED:
            self.book.wait(job.id, msg)
        else:
            self.book.note(job.id, "refused", msg)

    def _place(self, job: JobRecord, alloc: Allocation, reason: str, now: float) -> None:
        """Start an attempt: the attempt count and allocation are on disk before the process
        exists, so a crash now is recovered (no process of that attempt: requeue)."""
        attempt = job.attempt + 1
        resume = f"; resumes from checkpoint at step {job.checkpoint_step}" if job.checkpoint else ""
        rng = job.spec.resources.replicas
        top = rng.max or rng.min  # no max: exactly min
        if top > rng.min and alloc.replicas == rng.min and not getattr(self.policy, "resizes_replicas", False):
            # A replicas range is a request to be sized: say when nothing will size it (walk5).
            why = getattr(self.policy, "fixed_replicas_why", "does not resize replicas (sluice, pollux and optimus do)")
            fixed = f"a fixed {alloc.replicas} replicas (spec allows {rng.min} to {top})"
            reason += f"; {fixed}: {self.policy.name} {why}"
        job = self.book.transition(
            job.id,
            Phase.STARTING,
            reason,
            attempt=attempt,
            allocation=alloc,
            not_before=0.0,
            events=[
                (
                    "place",
                    f"attempt {attempt} on {alloc.describe()}: {reason}{resume}",
                    {"allocation": alloc.to_list(), "attempt": attempt},
                )
            ],
        )
        req = LaunchRequest(
            job_id=job.id,
            attempt=job.attempt,
            tenant=job.tenant,
            spec=job.spec,
            allocation=alloc,
            checkpoint_dir=self.checkpoint_dir(job),
            env=self._launch_env(job) if self._launch_env and job.spec.datasets else {},
            run_as=self._run_as(job.tenant) if self._run_as else None,
        )
        self._placed_at[job.id] = now
        try:
            self.engine.launch(req)
            self.launches += 1
        except Exception as err:
            log.warning("launch of %s attempt %d failed: %s", job.id, job.attempt, err)
            self._retry_or_fail(job, f"launch failed: {err}", now)

    @staticmethod
    def _under_the_ceiling(job: JobRecord, d: Decision) -> Decision:
        """The spec's `cpu.max` is the user's ceiling: every replica's CPU limit is kept at or
        under it, and "no limit" from a policy (FlowCon lifting limits, a work-conserving
        share) means the ceiling. Enforced here, where every policy's decision is executed."""
        ceiling = job.spec.resources.cpu.max
        if ceiling is None or not isinstance(d, Place | Resize | Migrate):
            return d
        assignments = tuple(
            replace(a, cpu_limit=ceiling if a.cpu_limit is None else min(a.cpu_limit, ceiling))
            for a in d.allocation.assignments
        )
        if assignments == d.allocation.assignments:
            return d
        # The policy's reason may say "no CPU limit": say what the job really gets beside it.
        held = f"held to its cpu.max of {ceiling:g}"
        return replace(d, allocation=Allocation(assignments), reason=f"{d.reason}; {held}")

    def _resize(self, job: JobRecord, d: Resize) -> None:
        assert job.allocation is not None
        old = job.allocation.describe()
        if not self._engine_call(job, "resize", lambda: self.engine.resize(job.id, job.attempt, d.allocation)):
            return
        if alloc_shape(d.allocation) != alloc_shape(job.allocation):
            self._tracker(job).restarting()  # GPUs or nodes changed in place: the job pays a restart
        self.book.update(
            job.id,
            "resize",
            f"{d.reason} [{old} -> {d.allocation.describe()}]",
            {"allocation": d.allocation.to_list()},
            allocation=d.allocation,
        )

    def _stop(self, job: JobRecord, intent: StopIntent) -> JobRecord:
        """Ask the job to checkpoint and exit; its exit is read through the persisted intent."""
        stopping = self.book.transition(job.id, Phase.STOPPING, f"{intent.kind}: {intent.reason}", stop_intent=intent)
        self._engine_call(job, "stop", lambda: self.engine.stop(job.id, job.attempt, checkpoint=True))
        return stopping

    def _engine_call(self, job: JobRecord, what: str, call: Callable[[], None]) -> bool:
        """An engine call that may fail for reasons of the moment (the process just exited,
        an agent is unreachable): recorded on the job, not fatal to it — its exit or the
        node's loss arrives through poll() and is handled there."""
        try:
            call()
            return True
        except Exception as err:
            log.warning("engine %s of %s failed: %s", what, job.id, err)
            self.book.note(job.id, "error", f"engine {what} failed: {type(err).__name__}: {err}")
            return False

    def _requeue(self, job: JobRecord, reason: str, **changes: Any) -> JobRecord:
        changes.setdefault("not_before", 0.0)
        return self.book.transition(
            job.id,
            Phase.QUEUED,
            reason,
            allocation=None,
            stop_intent=None,
            requeues=job.requeues + 1,
            **changes,
        )

    def _finish(self, job: JobRecord, phase: Phase, reason: str, **changes: Any) -> None:
        self.book.transition(job.id, phase, reason, **changes)
        self._forget(job.id)

    def _forget(self, job_id: str) -> None:
        self._trackers.pop(job_id, None)
        self._after_met.discard(job_id)
        self._after_done.pop(job_id, None)
        self._after_of.pop(job_id, None)
        self._placed_at.pop(job_id, None)
        self._sizes.pop(job_id, None)

    def _execute_node(self, d: NodeDecision) -> None:
        st = self._nodes.get(d.node)
        if st is None:
            raise KeyError(d.node)
        if st.health == d.health and st.reason == d.reason:
            return
        now = self.engine.clock()
        cordoned_by = d.by if d.health == NodeHealth.CORDONED else None
        self.store.save_node(NodeRecord(d.node, d.health, d.reason, cordoned_by, now))
        st.health, st.reason = d.health, d.reason
        self.store.append_event(now, "node", f"{d.node} -> {d.health}: {d.reason}", node=d.node)
        self._count(f"node {d.health}", d.by if d.by in ("detector", "operator") else "other")
        if d.health in (NodeHealth.CORDONED, NodeHealth.LOST):
            for job in self._jobs_on(d.node):
                if job.phase in (Phase.STARTING, Phase.RUNNING):
                    why = f"node {d.node} {d.health.lower()}: {d.reason}"
                    self._stop(job, StopIntent(StopKind.PREEMPT, why, asked_at=now))

    # ----------------------------------------------------------------- recovery (control/recovery.py)

    def load_live(self) -> list[JobRecord]:
        """Read every unfinished job from the store (a control plane starting up)."""
        with self.lock:
            return self.book.load_live()

    def adopt_running(self, job_id: str) -> None:
        """A live process of the job's current attempt survived a control-plane restart."""
        with self.lock:
            job = self.book.get(job_id)
            assert job is not None
            msg = f"adopted running attempt {job.attempt} after control-plane restart"
            now = self.engine.clock()
            job, unwatched = self._charge_unwatched(job, now)
            if unwatched:
                msg += f"; {unwatched:.0f}s run while the plane was down counted"
            if self._last_step_time is None:
                self._last_step_time = now  # the first round counts on from here, not from itself
            if job.phase == Phase.STARTING:
                self.book.transition(
                    job_id, Phase.RUNNING, "adopted after control-plane restart", events=[("recovery", msg, None)]
                )
            else:
                self.book.update(job_id, "recovery", msg)

    def _charge_unwatched(self, job: JobRecord, end: float) -> tuple[JobRecord, float]:
        """Charge a Starting or Running attempt for [run_until, end): time it ran while no plane
        counted (a restart adopting it, or reading its exit). The job as it is after, and the
        seconds charged (0 when there were none)."""
        start = job.run_until
        if job.phase not in (Phase.STARTING, Phase.RUNNING) or start is None or start >= end:
            return job, 0.0
        self._charge(job, start, end)
        return self.book.get(job.id) or job, end - start

    def resume_lost(self, job_id: str) -> None:
        """The job's process ended while the control plane was down and left no exit code."""
        with self.lock:
            job = self.book.get(job_id)
            assert job is not None
            self._after_process_gone(job, "process gone while the control plane was down", self.engine.clock())

    # ----------------------------------------------------------------- helpers

    def checkpoint_dir(self, job: JobRecord) -> str:
        return confine.checkpoint_dir(job.spec.checkpoint.location, self.checkpoint_root, job.id)

    def _admit(self) -> None:
        """Admission (policy/admission.py, pure): pending jobs get their queue's quota, wait
        with the quota reason, or take quota back from borrowing or lower-priority jobs; the
        decisions are carried out here through the book."""
        self._stalls = {}
        live = self.book.live()
        if not any(j.phase == Phase.PENDING for j in live) and not _priorities_differ(live):
            if any(j.phase == Phase.QUEUED and j.attempt == 0 for j in live):  # back to wait past a disk cap
                self._hold_for_tenant_disk(live, set(), self.store.list_tenants())
            return
        held = self._hold_for_predecessors(live)
        held |= self._hold_to_array_parallel(live, held)
        tenant_records = self.store.list_tenants()
        held |= self._hold_for_tenant_disk(live, held, tenant_records)
        now = self.engine.clock()
        no_preempt = self._non_preempting_classes(live)
        jobs = [
            self._admission_job(j, no_preempt)
            for j in live
            if j.phase != Phase.SUSPENDED and j.id not in held and self.book.is_live(j.id)
        ]
        if not any(j.stage == admission.Stage.PENDING for j in jobs) and not admission.capacity_preemption_possible(
            jobs
        ):
            return
        tenants = {t.name: admission.TenantLimits(weight=t.weight, max_jobs=t.max_running_jobs) for t in tenant_records}
        decisions = admission.admit(
            self._queues_this_round(),
            jobs,
            tenants=tenants,
            capacity=self._capacity(),
            now=now,
            preempt_min_runtime_s=self.preempt_min_runtime_s,
            grants={q: frozenset(ts) for q, ts in self.store.queue_grants().items()},
        )
        for d in decisions:
            job = self.book.get(d.job_id) if self.book.is_live(d.job_id) else None
            if job is None:
                continue
            try:
                if isinstance(d, admission.Admit) and job.phase == Phase.PENDING:
                    self.book.transition(job.id, Phase.QUEUED, d.reason)
                elif isinstance(d, admission.Hold) and job.phase == Phase.PENDING:
                    self.book.wait(job.id, d.reason)
                elif isinstance(d, admission.Stall) and job.phase == Phase.QUEUED:
                    self._stalls[job.id] = d.reason
                elif isinstance(d, admission.Evict):
                    # The job's reason says only what its tenant may read; the operator's log
                    # has both jobs and both queues.
                    log.info("admission: %s (tenant %s) %s", job.id, job.tenant, d.detail or d.reason)
                    self._evict(job, d.reason, now)
            except StoreUnavailable:
                raise
            except Exception as err:
                self._contain(job.id, "admitting it", err)

    def _hold_for_predecessors(self, live: Iterable[JobRecord]) -> set[str]:
        """The pending jobs that wait for the jobs they start after (`spec.after`,
        `spec.after_any`), each told which and how they stand; kept out of admission, so they
        take no quota. A job whose `after` predecessor ended other than Succeeded is cancelled:
        it would never start; one of `after_any` has only to end (or be gone: only an ended job
        is forgotten). Once all are done the job is admitted like any other, and never held
        again (an ended job stays so); the ones seen done are remembered, not read from the
        store every round."""
        held: set[str] = set()
        live = list(live)
        ids = {j.id for j in live}
        self._after_met &= ids  # a job cancelled while pending leaves no entry behind
        for gone in self._after_done.keys() - ids:
            del self._after_done[gone]
        for gone in self._after_of.keys() - ids:
            del self._after_of[gone]
        for job in live:
            if job.phase != Phase.PENDING or not job.spec.predecessors or job.id in self._after_met:
                continue
            done = self._after_done.setdefault(job.id, set())
            waiting: list[str] = []
            waiting_any: list[str] = []
            if job.id not in self._after_of:
                self._after_of[job.id] = self._after_ids(job)
            for dep, any_end in self._after_of[job.id]:
                if dep in done:
                    continue
                other = self.book.get(dep)
                if other is None or other.phase.terminal:
                    if any_end or (other is not None and other.phase == Phase.SUCCEEDED):
                        done.add(dep)
                        continue
                    ended = "and is gone" if other is None else str(other.phase)
                    self._finish(job, Phase.CANCELLED, f"not started: job {dep}, which it starts after, ended {ended}")
                    break
                (waiting_any if any_end else waiting).append(f"{dep} ({other.phase})")
            else:
                if waiting or waiting_any:
                    held.add(job.id)
                    said = [
                        f"{', '.join(w[:5])}{f' and {len(w) - 5} more' if len(w) > 5 else ''} {how}"
                        for w, how in ((waiting, "to succeed (after)"), (waiting_any, "to end (after_any)"))
                        if w
                    ]
                    self.book.wait(job.id, f"waiting for {' and for '.join(said)}")
                else:
                    self._after_met.add(job.id)
                    self._after_done.pop(job.id, None)
                    self._after_of.pop(job.id, None)
        return held

    def _after_ids(self, job: JobRecord) -> list[tuple[str, bool]]:
        """The jobs `job` starts after, each with whether any end will do (`after_any`) or only
        success (`after`): each id given, an array's id standing for every job of that array of
        the same tenant (`<id>-0` to `<id>-<count-1>`)."""
        out: list[tuple[str, bool]] = []
        for deps, any_end in ((job.spec.after, False), (job.spec.after_any, True)):
            for dep in deps:
                if self.book.get(dep) is None and (count := array_count(self.book, dep, job.tenant)) is not None:
                    out.extend((f"{dep}-{i}", any_end) for i in range(count))
                else:
                    out.append((dep, any_end))
        return out

    def _hold_to_array_parallel(self, live: Iterable[JobRecord], held: set[str]) -> set[str]:
        """The pending jobs of arrays with `parallel` set that may not be admitted now: an
        array has at most `parallel` jobs admitted (Queued, Starting, Running or Stopping), the
        lowest index first; the others wait Pending, taking no quota, told why. Jobs already
        held (for the jobs they start after) do not take a turn."""
        arrays: dict[tuple[str, str, int], list[tuple[int, JobRecord]]] = {}
        for job in live:
            a = job.spec.array
            if a is not None and a.parallel is not None and a.id is not None:
                arrays.setdefault((job.tenant, a.id, a.parallel), []).append((a.index or 0, job))
        out: set[str] = set()
        for (_, array_id, parallel), jobs in arrays.items():
            admitted = sum(j.phase in _ARRAY_TURN_PHASES for _, j in jobs)
            waiting = [j for _, j in sorted(jobs, key=lambda x: x[0]) if j.phase == Phase.PENDING and j.id not in held]
            for job in waiting[max(0, parallel - admitted) :]:
                out.add(job.id)
                self.book.wait(
                    job.id,
                    f"waiting for a turn: array {array_id} runs at most {parallel} of its jobs at once "
                    "(array.parallel), the lowest index first",
                )
        return out

    def _hold_for_tenant_disk(
        self, live: Iterable[JobRecord], held: set[str], tenants: Iterable[TenantRecord]
    ) -> set[str]:
        """The pending jobs of tenants whose jobs' run folders hold their `max_disk_mb` or more:
        what each live job held at its newest disk check, plus each ended job's last (its
        folder outlives it until deleted, so a tenant could otherwise fill the shared disk with
        the folders of jobs long ended). They wait, taking no quota, until the tenant deletes
        some (`sluice job delete`) or an admin raises the cap; running jobs run on. Ended
        jobs' sums are read at most every DISK_USE_TTL_S (and after `forget_disk_use`)."""
        live = list(live)
        caps = {t.name: t.max_disk_mb for t in tenants if t.max_disk_mb}
        # Queued and never placed: admission lets a tenant's pending jobs through all at once
        # while under its cap, and those waiting for a node then started however far past it the
        # tenant had gone (red team s29). One that ran (requeued after a crash, a lost node or a
        # preemption) has its folder counted already and restarts into it, as running jobs run on.
        waiting = [
            j
            for j in live
            if (j.phase == Phase.PENDING or (j.phase == Phase.QUEUED and j.attempt == 0))
            and j.id not in held
            and j.tenant in caps
        ]
        if not waiting:
            return set()
        used = dict(self._ended_disk_mb({j.tenant for j in waiting}))
        for job in live:
            if job.tenant in caps and job.disk_mb:
                used[job.tenant] = used.get(job.tenant, 0.0) + job.disk_mb
        out: set[str] = set()
        for job in waiting:
            cap = caps[job.tenant]
            if used.get(job.tenant, 0.0) >= cap:
                out.add(job.id)
                reason = (
                    f"waiting for disk: tenant {job.tenant}'s jobs hold its max_disk_mb of {cap} MiB or more "
                    "(every job's run folder counts, its own and ended jobs' until deleted: sluice job delete)"
                )
                if job.phase == Phase.QUEUED:
                    self.book.transition(job.id, Phase.PENDING, reason)  # a restart keeps its backoff
                    self._count("Evict", "disk")
                else:
                    self.book.wait(job.id, reason)
        return out

    def _ended_disk_mb(self, tenants: set[str]) -> dict[str, float]:
        """`Store.ended_disk_mb` of these tenants as last read, plus what the jobs that ended
        since held (`book.ended_disk_mb`: their disk moved from the live jobs' sum to this one);
        read again when DISK_USE_TTL_S old, after `forget_disk_use`, or when asked for a tenant
        not read. Not at each job's end: a busy cluster ends one most rounds, and each read
        sums every ended job of every waiting tenant (red team s29)."""
        now = time.monotonic()
        at, base, known = self._ended_disk
        if now - at > DISK_USE_TTL_S:
            at, base, known = now, {}, {}
        missing = tenants - set(known)
        if missing:  # those read now join the others, each with what the book had ended then
            read = self.store.ended_disk_mb(missing)
            known = {**known, **{t: read.get(t, 0.0) for t in missing}}
            base = {**base, **{t: self.book.ended_disk_mb.get(t, 0.0) for t in missing}}
            self._ended_disk = (at, base, known)
        since = self.book.ended_disk_mb
        return {t: known[t] + since.get(t, 0.0) - base[t] for t in tenants}

    def tenant_disk_mb(self, tenant: str) -> float:
        """What `tenant`'s jobs' run folders hold as its `max_disk_mb` counts it: its live jobs'
        newest disk checks plus its ended jobs' last. The caller holds the lock."""
        live = sum(j.disk_mb or 0.0 for j in self.book.live() if j.tenant == tenant)
        return live + self._ended_disk_mb({tenant})[tenant]

    def forget_disk_use(self) -> None:
        """Ended jobs' disk use changed (a job deleted): read it again next round."""
        self._ended_disk = (-math.inf, {}, {})

    def _evict(self, job: JobRecord, reason: str, now: float) -> None:
        """Give an admitted job's quota back: a queued one returns to Pending now; a running
        one is preempted through its checkpoint, is requeued when it exits, and returns to
        Pending in the next admission that still needs its quota."""
        if job.phase == Phase.QUEUED:
            self.book.transition(job.id, Phase.PENDING, reason, not_before=0.0)
            self._count("Evict", "quota")
        elif job.phase in (Phase.STARTING, Phase.RUNNING):
            self._stop(job, StopIntent(StopKind.PREEMPT, reason, asked_at=now))
            self._count("Preempt", "quota")

    def _queues_this_round(self) -> dict[str, QueueConfig]:
        """The queues, read from the store at most once a round: the time limits and admission
        both need them, and a queue changed meanwhile applies from the next round either way."""
        if self._round_queues is None:
            self._round_queues = self.queues()
        return self._round_queues

    def queues(self) -> dict[str, QueueConfig]:
        """Every queue as the store has it now (quotas change live), with the built-in
        `default` queue (no quota) unless an admin has given it one."""
        out = {q.name: q.config for q in self.store.list_queues()}
        out.setdefault(DEFAULT_QUEUE, QueueConfig(DEFAULT_QUEUE))
        return out

    def _non_preempting_classes(self, live: Iterable[JobRecord]) -> frozenset[str]:
        """The priority classes whose jobs never preempt (read only when a job names a class)."""
        if not any(j.spec.priority_class for j in live):
            return frozenset()
        return frozenset(p.name for p in self.store.list_priority_classes() if not p.preempts)

    def _admission_job(self, job: JobRecord, no_preempt: frozenset[str] = frozenset()) -> admission.AdmissionJob:
        stage = {
            Phase.PENDING: admission.Stage.PENDING,
            Phase.QUEUED: admission.Stage.QUEUED,
            Phase.STOPPING: admission.Stage.STOPPING,
        }.get(job.phase, admission.Stage.ACTIVE)
        intent = job.stop_intent
        return admission.AdmissionJob(
            id=job.id,
            tenant=job.tenant,
            queue=job.spec.queue,
            priority=job.spec.priority,
            submitted_at=job.submitted_at,
            demand=job_demand(job.spec),
            stage=stage,
            running_since=self._placed_at.get(job.id, job.started_at) if stage == admission.Stage.ACTIVE else None,
            preempted=intent is not None and intent.kind in (StopKind.PREEMPT, StopKind.SUSPEND, StopKind.CANCEL),
            may_preempt=job.spec.priority_class not in no_preempt,
        )

    def _capacity(self) -> Amounts:
        """What the schedulable nodes hold: the denominator of shares where a cohort has no
        quota of its own."""
        up = [n for n in self._nodes.values() if n.health == NodeHealth.HEALTHY]
        return Amounts(
            cores=sum(n.cpu for n in up),
            memory_mb=float(sum(n.memory_mb for n in up)),
            gpus=float(sum(n.gpus for n in up)),
            jobs=0.0,
        )

    def _account_service(self, now: float) -> None:
        last, self._last_step_time = self._last_step_time, now
        if last is None or now <= last:
            return
        for job in self.book.live():
            if job.allocation is not None and job.phase in (Phase.STARTING, Phase.RUNNING):
                self._charge(job, last, now)
        for job_id in [j for j in self._cpu_readings if not self.book.is_live(j)]:
            del self._cpu_readings[job_id]  # ended otherwise (a lost node, a cancel): nothing to add to

    def _charge(self, job: JobRecord, start: float, end: float) -> None:
        """Count [start, end) as run and held by `job`: its `run_s` and attained service, and
        its tenant's held time, split at each hour's turn (rounds more than an hour apart,
        after a store outage, a paused plane or a plane that was down, span several)."""
        if job.allocation is None or end <= start:
            return
        gpus = job.allocation.total_gpus
        per_s = gpus if gpus else job.allocation.total_cpu_request
        dt = end - start
        self.book.observe(
            job.id,
            attained_service=job.attained_service + dt * per_s,
            run_s=job.run_s + dt,
            run_until=end,
            **self._cpu_used(job),
        )
        t = start
        while t < end:
            hour = hour_of(t)
            turn = min(end, hour + 3600.0)  # assigned, not added: a float sum could stop short of it
            acc = self._held_acc(job, hour)
            acc[0] += (turn - t) * per_s
            acc[1] += turn - t
            t = turn

    def _cpu_used(self, job: JobRecord) -> dict[str, float]:
        """The record changes that count the job's newest CPU reading (none when it has none, or
        it is of another attempt or not past what was counted): the CPU-seconds past the last
        reading, added to `cpu_used_s` and to its tenant's held time in the hour it was read (a
        reading covers the seconds since the one before, a few at most)."""
        reading = self._cpu_readings.pop(job.id, None)
        if reading is None:
            return {}
        attempt, cpu_s, at = reading
        if attempt != job.attempt or cpu_s <= job.attempt_cpu_s:
            return {}
        self._held_acc(job, hour_of(at))[2] += cpu_s - job.attempt_cpu_s
        return {"cpu_used_s": job.cpu_used_s + cpu_s - job.attempt_cpu_s, "attempt_cpu_s": cpu_s}

    def _held_acc(self, job: JobRecord, hour: float) -> list[float]:
        return self._held.setdefault((job.tenant, hour, bool(job.spec.resources.gpus)), [0.0, 0.0, 0.0])

    def flush_held_time(self, *, force: bool = False) -> None:
        """Write the held time counted since the last write (what `sluice usage --since` sums),
        at most every `save_progress_every_s` like jobs' progress (all with force): a crash
        loses at most that much of it, as it does of `run_s`. The jobs' counts (`run_until`,
        `attempt_cpu_s`) are written first, so a plane that adopts them never charges again
        what is written here."""
        now = self.engine.clock()
        if not self._held or (not force and now - self._held_saved_at < self.book.save_progress_every_s):
            return
        self.book.flush(force=True)
        rows = [HeldTime(t, h, g, s, r, c) for (t, h, g), (s, r, c) in self._held.items()]
        try:
            self.store.add_held_time(rows)
        except StoreUnavailable:
            raise
        except Exception:  # kept, and tried again at the next interval; the round goes on
            log.exception("could not save the held time of %d tenant-hours", len(rows))
            self._held_saved_at = now
            return
        self._held.clear()
        self._held_saved_at = now

    def _hold_to_time_limits(self, now: float) -> None:
        """A job that has run its `max_runtime_s` is stopped through its checkpoint and ends
        Failed (a TIME_LIMIT stop). Checked before admission and the policy act, so a job is
        never preempted, moved or resized in the round its time runs out (and a stopping job
        does not run on the clock). One waiting in the queue at its limit (its seconds come from
        a store written by another plane) ends Failed without running again."""
        for job in self.book.live():
            if job.phase not in (Phase.STARTING, Phase.RUNNING, Phase.PENDING, Phase.QUEUED):
                continue
            queues = self._queues_this_round()  # read only while a job could be held
            queue = queues.get(job.spec.queue, QueueConfig(job.spec.queue))
            limit = queue.runtime_limit(job.spec.max_runtime_s)
            if limit is None or job.run_s < limit.seconds:
                continue
            why = f"ran {job.run_s:.0f}s, past {limit.whose} of {limit.seconds:g}s"
            if job.phase in (Phase.PENDING, Phase.QUEUED):
                self._finish(job, Phase.FAILED, f"time limit: {why}")
            elif job.phase in (Phase.STARTING, Phase.RUNNING):
                self._stop(job, StopIntent(StopKind.TIME_LIMIT, why, asked_at=now))

    def _check_qoe(self, job: JobRecord, tr: ProgressTracker, t: float) -> None:
        target = job.spec.qoe.loss if job.spec.qoe else None
        if target is not None and tr.loss is not None and tr.loss <= target and job.qoe_met_at is None:
            self.book.update(job.id, "qoe", f"reached loss target {target:g} at step {tr.step}", qoe_met_at=t)

    def _job_view(self, job: JobRecord) -> JobView:
        spec = job.spec
        res = spec.resources
        tr = self._trackers.get(job.id)
        qoe = spec.qoe
        deadline = None
        if qoe is not None:
            if qoe.deadline_s is not None:
                deadline = job.submitted_at + qoe.deadline_s
            elif qoe.deadline is not None:
                deadline = qoe.deadline.timestamp()
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
            # No more than the engine runs (a spec stored before submit refused more, or
            # moved to an engine with a lower limit): a policy sizes only within what it can do.
            replicas_max=max(res.replicas.min, min(res.replicas.max or 0, self.engine.capabilities.max_replicas)),
            allocation=job.allocation,
            started_at=job.started_at,
            attempt=job.attempt,
            restarts=job.restarts,
            attained_service=job.attained_service,
            progress=tr.snapshot() if tr else _EMPTY_PROGRESS,
            qoe_loss=qoe.loss if qoe else None,
            qoe_deadline=deadline,
            datasets=tuple(self._sizes_of(job) or (d.name for d in spec.datasets)),
            dataset_bytes=self._sizes_of(job),
            not_before=job.not_before,
            oracle=self._oracle.oracle(job.id) if self._oracle is not None else None,
        )

    def _sizes_of(self, job: JobRecord) -> MappingProxyType[str, int]:
        if not job.spec.datasets or self._dataset_bytes is None:
            return _NO_SIZES
        if job.id not in self._sizes:
            self._sizes[job.id] = MappingProxyType(self._dataset_bytes(job))
        return self._sizes[job.id]

    def _tracker(self, job: JobRecord) -> ProgressTracker:
        tr = self._trackers.get(job.id)
        if tr is None:
            tr = self._trackers[job.id] = ProgressTracker()
            if job.spec.qoe and job.spec.qoe.loss is not None:
                tr.loss_target = job.spec.qoe.loss
        return tr

    def _jobs_on(self, node: str) -> list[JobRecord]:
        return [
            j for j in self.book.live() if j.phase.active and j.allocation is not None and node in j.allocation.nodes
        ]

    def _refresh_nodes(self) -> None:
        saved = {n.name: n for n in self.store.list_nodes()}
        for info in self.engine.nodes():
            if info.name not in self._nodes:
                st = NodeState(info.name, info.cpu, info.gpus, info.memory_mb, dict(info.labels))
                rec = saved.get(info.name)
                if rec is not None and rec.health == NodeHealth.CORDONED:
                    st.health, st.reason = rec.health, rec.reason
                self._nodes[info.name] = st

    def jobs_on_nodes(self, names: Iterable[str]) -> dict[str, int]:
        """How many active jobs each named node holds."""
        return {n: len(self._jobs_on(n)) for n in names}


def _priorities_differ(live: Iterable[JobRecord]) -> bool:
    """Whether an admitted, unplaced job outranks a placed one (a cheap pre-check: only then
    may admission preempt for capacity with no job pending; policy/admission.py)."""
    queued = [j.spec.priority for j in live if j.phase == Phase.QUEUED]
    if not queued:
        return False
    top = max(queued)
    return any(j.spec.priority < top for j in live if j.phase in (Phase.STARTING, Phase.RUNNING))


def job_demand(spec: JobSpec) -> Amounts:
    """What admission reserves for a job: its guarantees for all its replicas at once (gang
    admission: the whole job's quota or none of it)."""
    res = spec.resources
    n = res.replicas.min
    return Amounts(cores=res.cpu.min * n, memory_mb=float((res.memory_mb or 0) * n), gpus=float(res.gpus * n), jobs=1.0)


_EMPTY_PROGRESS = ProgressTracker().snapshot()
_NO_SIZES: MappingProxyType[str, int] = MappingProxyType({})


__all__ = ["Controller", "NodeState", "RoundObserver"]
