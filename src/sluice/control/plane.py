"""ControlPlane: the controller plus tenants, auth and read models — what the API serves.

Every call takes the caller (an authenticated TenantRecord). A tenant sees, follows and
cancels only its own jobs; another tenant's job is reported as not found, exactly like a
job that does not exist. Admin tenants manage tenants and nodes and see every job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sluice.agent.faults import FaultReport
from sluice.control.auth import hash_token, new_token
from sluice.control.controller import Controller
from sluice.control.datasets import DatasetService
from sluice.control.errors import Conflict, Forbidden, NotFound, Unauthorized
from sluice.control.recovery import RecoveryReport, recover
from sluice.data.settings import CacheSettings
from sluice.engine.base import Engine, FaultInjector
from sluice.model import JobRecord, NodeHealth, Phase, ProgressSignals
from sluice.policy import Policy, make_policy
from sluice.settings import Settings
from sluice.spec import JobSpec, SpecError, TenantSpec
from sluice.spec.errors import FieldProblem
from sluice.store import Store, TenantRecord, open_store
from sluice.store.base import EventRecord

log = logging.getLogger("sluice.plane")


@dataclass(frozen=True)
class NodeStatus:
    name: str
    cpu: float
    gpus: int
    health: str
    reason: str
    jobs: int
    cpu_requested: float
    cpu_limits: float | None


def make_engine(settings: Settings) -> Engine:
    """The engine named by settings.engine. Imported lazily: Ray is heavy."""
    if settings.engine == "local":
        from sluice.engine.local import LocalEngine

        return LocalEngine(settings)
    if settings.engine == "ray":
        from sluice.engine.ray import RayEngine

        return RayEngine(settings)
    raise ValueError(f"engine: unknown engine {settings.engine!r}; choose local or ray")


class ControlPlane:
    def __init__(self, settings: Settings, store: Store, engine: Engine, policy: Policy) -> None:
        self.settings = settings
        self.store = store
        self.engine = engine
        self.datasets = DatasetService(store, CacheSettings.for_home(settings.home), engine=engine)
        self.controller = Controller(
            store,
            engine,
            policy,
            launch_env=lambda job: self.datasets.launch_env(job.tenant, [d.name for d in job.spec.datasets]),
            dataset_bytes=lambda job: self.datasets.dataset_bytes(job.tenant, [d.name for d in job.spec.datasets]),
            # Engines whose nodes do not share this machine's disk (Ray) name a shared root.
            checkpoint_root=str(getattr(engine, "checkpoint_root", None) or settings.runs_dir),
            restart_backoff_s=settings.restart_backoff_s,
        )
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.recovery: RecoveryReport | None = None
        self.health = self._attach_health(settings) if settings.health_enabled else None

    def _attach_health(self, settings: Settings) -> object:
        """The node health monitor as a controller observer (issue 5). Virtual nodes share
        this machine's disk, network and memory, so only their own cores' KPIs are judged."""
        from sluice.control.health_monitor import MACHINE_WIDE, HealthMonitor, MonitorConfig

        ignore = ("jobs", *MACHINE_WIDE) if settings.virtual_nodes > 1 else ("jobs",)
        cfg = MonitorConfig(
            train_samples=settings.health_train_samples,
            q=settings.health_q,
            change_grace_s=settings.health_change_grace_s,
            retrain_growth=settings.health_retrain_growth,
            history_samples=settings.health_history_samples,
            ignore=ignore,
            models_dir=settings.home / "health",
        )
        return HealthMonitor.attach(self.controller, cfg)

    @classmethod
    def from_settings(cls, settings: Settings) -> ControlPlane:
        settings.home.mkdir(parents=True, exist_ok=True)
        store = open_store(settings.db_url)
        engine = make_engine(settings)
        policy = make_policy(settings.policy, interval_s=settings.policy_interval_s)
        return cls(settings, store, engine, policy)

    # ---------------------------------------------------------------- lifecycle

    def recover(self) -> RecoveryReport:
        self.recovery = recover(self.controller)
        log.info("recovery: %s", self.recovery.summary())
        return self.recovery

    def step(self) -> None:
        self.controller.step()

    def start(self) -> None:
        """Recover, then run the reconcile loop in a background thread."""
        if self.recovery is None:
            self.recover()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="sluice-reconcile", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        interval = self.settings.reconcile_interval_s
        while not self._stop.is_set():
            t0 = time.monotonic()
            launches = self.controller.launches
            try:
                self.controller.step()
            except Exception:  # keep reconciling; the failure is logged with its traceback
                log.exception("reconcile round failed")
            # Right after a launch, look again soon: the start event is what users wait for.
            wait = 0.05 if self.controller.launches != launches else interval - (time.monotonic() - t0)
            self._wake.wait(max(0.0, wait))
            self._wake.clear()

    def wake(self) -> None:
        """Run the next reconcile round now (a job was submitted or cancelled)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop reconciling. Job processes keep running and are adopted on the next start."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.engine.close()
        self.store.close()

    # ---------------------------------------------------------------- tenants and auth

    def bootstrap_tenants(self) -> dict[str, str]:
        """On a fresh store: create `admin` (admin) and `default` tenants; return their tokens."""
        if self.store.list_tenants():
            return {}
        out = {}
        for name, admin in (("admin", True), ("default", False)):
            token = new_token()
            self.store.create_tenant(TenantRecord(name, hash_token(token), admin=admin, created_at=time.time()))
            out[name] = token
        return out

    def authenticate(self, token: str | None) -> TenantRecord:
        if not token:
            raise Unauthorized("missing token")
        tenant = self.store.tenant_by_token_hash(hash_token(token))
        if tenant is None:
            raise Unauthorized("invalid token")
        return tenant

    def _require_admin(self, caller: TenantRecord) -> None:
        if not caller.admin:
            raise Forbidden("this needs an admin token")

    def create_tenant(self, caller: TenantRecord, spec: TenantSpec) -> tuple[TenantRecord, str]:
        self._require_admin(caller)
        if self.store.get_tenant(spec.name) is not None:
            raise Conflict(f"tenant {spec.name!r} already exists")
        token = new_token()
        rec = TenantRecord(
            spec.name,
            hash_token(token),
            admin=spec.admin,
            max_running_jobs=spec.max_running_jobs,
            weight=spec.weight,
            created_at=time.time(),
        )
        self.store.create_tenant(rec)
        return rec, token

    def list_tenants(self, caller: TenantRecord) -> list[TenantRecord]:
        self._require_admin(caller)
        return self.store.list_tenants()

    def delete_tenant(self, caller: TenantRecord, name: str) -> None:
        self._require_admin(caller)
        if self.store.get_tenant(name) is None:
            raise NotFound(f"tenant {name!r} not found")
        if name == caller.name:
            raise Conflict("a tenant cannot delete itself")
        live = [j for j in self.controller.jobs.values() if j.tenant == name and not j.phase.terminal]
        if live:
            raise Conflict(f"tenant {name!r} still has {len(live)} unfinished job(s)")
        self.store.delete_tenant(name)

    # ---------------------------------------------------------------- jobs

    def submit(self, caller: TenantRecord, spec: JobSpec) -> JobRecord:
        tenant = spec.tenant or caller.name
        if tenant != caller.name and not caller.admin:
            raise Forbidden(f"tenant: you may submit only as {caller.name!r}")
        if tenant != caller.name and self.store.get_tenant(tenant) is None:
            raise NotFound(f"tenant {tenant!r} not found")
        missing = self.datasets.missing(tenant, [d.name for d in spec.datasets])
        if missing:
            raise SpecError(
                [
                    FieldProblem("datasets", f"no dataset named {n!r} for tenant {tenant!r}; create it first")
                    for n in missing
                ]
            )
        job = self.controller.submit(tenant, spec)
        self.wake()
        return job

    def _visible(self, caller: TenantRecord, job: JobRecord | None, job_id: str) -> JobRecord:
        if job is None or (job.tenant != caller.name and not caller.admin):
            raise NotFound(f"job {job_id!r} not found")
        return job

    def get_job(self, caller: TenantRecord, job_id: str) -> JobRecord:
        with self.controller.lock:
            job = self.controller.jobs.get(job_id)
        if job is None:
            job = self.store.get_job(job_id)
        return self._visible(caller, job, job_id)

    def list_jobs(self, caller: TenantRecord, phases: Iterable[Phase] | None = None) -> list[JobRecord]:
        tenant = None if caller.admin else caller.name
        stored = {j.id: j for j in self.store.list_jobs(tenant=tenant, phases=phases)}
        ph = set(phases) if phases is not None else None
        with self.controller.lock:
            for jid in self.controller.active_ids:
                j = self.controller.jobs[jid]
                if (tenant is None or j.tenant == tenant) and (ph is None or j.phase in ph):
                    stored[jid] = j
                elif jid in stored:
                    del stored[jid]
        return sorted(stored.values(), key=lambda j: (j.submitted_at, j.id))

    def cancel(self, caller: TenantRecord, job_id: str) -> JobRecord:
        job = self.get_job(caller, job_id)
        if job.phase.terminal:
            raise Conflict(f"job {job_id} already {job.phase}")
        with self.controller.lock:
            if job_id not in self.controller.jobs:
                self.controller.load([job])
            done = self.controller.cancel(job_id, f"cancelled by {caller.name}")
        self.wake()
        return done

    def why(self, caller: TenantRecord, job_id: str) -> list[EventRecord]:
        self.get_job(caller, job_id)
        return self.store.events(job_id=job_id)

    def progress(self, caller: TenantRecord, job_id: str) -> ProgressSignals | None:
        self.get_job(caller, job_id)
        with self.controller.lock:
            tr = self.controller.trackers.get(job_id)
            return tr.snapshot() if tr else None

    def log_path(self, caller: TenantRecord, job_id: str) -> Path | None:
        self.get_job(caller, job_id)
        p = self.engine.log_path(job_id)
        return Path(p) if p else None

    # ---------------------------------------------------------------- nodes

    def nodes(self) -> list[NodeStatus]:
        with self.controller.lock:
            view = self.controller.view()
            out = []
            for n in view.nodes.values():
                on = view.jobs_on(n.name)
                here = [a for j in on if j.allocation for a in j.allocation.assignments if a.node == n.name]
                limits = [a.cpu_limit for a in here]
                requested = float(sum(a.cpu_request for a in here))
                total_limit = None if None in limits else float(sum(x for x in limits if x is not None))
                out.append(
                    NodeStatus(n.name, n.cpu, n.gpus, str(n.health), n.health_reason, len(on), requested, total_limit)
                )
            return out

    def cached_by_node(self) -> dict[str, dict[str, float]]:
        """node -> dataset -> share of its bytes in that node's cache (from the agents' reports)."""
        with self.controller.lock:
            return {n.name: dict(n.cached_datasets) for n in self.controller.view().nodes.values()}

    def cordon(self, caller: TenantRecord, node: str, reason: str) -> None:
        self._require_admin(caller)
        try:
            self.controller.set_node_health(node, NodeHealth.CORDONED, reason or "cordoned by operator", by="operator")
        except KeyError:
            raise NotFound(f"node {node!r} not found") from None

    def uncordon(self, caller: TenantRecord, node: str) -> None:
        self._require_admin(caller)
        try:
            self.controller.set_node_health(node, NodeHealth.HEALTHY, "uncordoned by operator", by="operator")
        except KeyError:
            raise NotFound(f"node {node!r} not found") from None

    def inject_fault(
        self,
        caller: TenantRecord,
        node: str,
        kind: str,
        seconds: float,
        workers: int | None = None,
        memory_mb: int = 512,
    ) -> FaultReport:
        """Make a node sick on purpose for `seconds` (admin): how an operator checks that the
        health loop cordons a sick node and moves its jobs. Recorded in the event log."""
        self._require_admin(caller)
        injector = self._fault_injector(node)
        try:
            report = injector.inject_fault(node, kind, seconds, workers, memory_mb)
        except KeyError:
            raise NotFound(f"node {node!r} has no live agent") from None
        self.store.append_event(
            time.time(),
            "node",
            f"{node}: {report.kind} fault injected by {caller.name} for {report.seconds:g}s",
            node=node,
            data={"fault": report.kind, "seconds": report.seconds, "pids": report.pids},
        )
        return report

    def stop_faults(self, caller: TenantRecord, node: str) -> int:
        """Stop every fault injected on the node (admin); how many were running."""
        self._require_admin(caller)
        try:
            stopped = self._fault_injector(node).stop_faults(node)
        except KeyError:
            raise NotFound(f"node {node!r} has no live agent") from None
        self.store.append_event(time.time(), "node", f"{node}: {stopped} fault(s) stopped by {caller.name}", node=node)
        return stopped

    def _fault_injector(self, node: str) -> FaultInjector:
        if node not in self.controller.nodes:
            raise NotFound(f"node {node!r} not found")
        if not isinstance(self.engine, FaultInjector):
            raise Conflict(f"the {self.engine.name} engine cannot inject faults")
        return self.engine
