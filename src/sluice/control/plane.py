"""ControlPlane: the controller plus tenants, auth and read models — what the API serves.

Every call takes the caller (an authenticated TenantRecord). A tenant sees, follows and
cancels only its own jobs; another tenant's job is reported as not found, exactly like a
job that does not exist. Admin tenants manage tenants and nodes and see every job.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sluice.agent.disk_watch import MIB, folder_size
from sluice.agent.faults import FaultReport
from sluice.agent.isolation import PLANE_DIR_MODE, PRIVATE_DIR_MODE, Isolation, detect_isolation
from sluice.control.auth import hash_token, new_token
from sluice.control.confine import checkpoint_base, checkpoint_dir, confine_checkpoint
from sluice.control.controller import Controller, array_count
from sluice.control.datasets import DatasetService
from sluice.control.errors import Conflict, Forbidden, NotFound, Unauthorized, Unavailable, some
from sluice.control.failpoints import Failpoints
from sluice.control.priorities import PriorityClassService
from sluice.control.queues import QueueService, QueueStatus
from sluice.control.recovery import RecoveryReport, recover
from sluice.control.resume import CopySlots, copy_checkpoints
from sluice.control.retention import DAY_S, Retention, RetentionThread
from sluice.control.usage import TenantUsage, by_tenant
from sluice.data.guard import guard_from
from sluice.engine.base import Engine, EngineTaken, FaultInjector, RunFolders
from sluice.health.monitor import HealthMonitor, MonitorConfig
from sluice.model import JobRecord, JobUser, NodeHealth, Phase, ProgressSignals
from sluice.model.queue import PriorityClass
from sluice.policy import Policy, make_policy
from sluice.settings import Settings
from sluice.spec import (
    GrantSpec,
    JobSpec,
    PriorityClassSpec,
    QueuePatch,
    QueueSpec,
    SpecError,
    TenantPatch,
    TenantSpec,
)
from sluice.spec.errors import FieldProblem
from sluice.spec.job import SET_PER_ATTEMPT, job_ref
from sluice.store import Store, StoreInUse, StoreUnavailable, TenantRecord, open_store
from sluice.store.base import DuplicateError, EventRecord

log = logging.getLogger("sluice.plane")


BUILT_IN_TENANTS = {
    "admin": "its token ($SLUICE_HOME/admin.token) is how sluice is administered",
    "default": "its token ($SLUICE_HOME/token) is what the CLI and the client use when no token is given",
}
"""The tenants bootstrap_tenants makes, and why deleting one (409) is refused."""


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


@dataclass(frozen=True)
class JobsDeleted:
    """What a delete forgot: the jobs (records and events) and how many run folders went."""

    ids: list[str]
    folders: int


@dataclass(frozen=True)
class CordonOutcome:
    """What a cordon set in motion: the jobs it moves off the node (each checkpoints, stops
    and waits for a place again) and how many other nodes can take new jobs."""

    moved: list[str]
    other_schedulable: int


_DELETED_NAME = (
    "tenant name {name!r} belonged to a deleted tenant; names are never reused, so its jobs, logs and "
    "checkpoints stay out of a newcomer's reach — choose another name"
)


def secure_home(home: Path, isolation: Isolation) -> None:
    """$SLUICE_HOME is the plane's: 0700; with isolation 0711, so a job (another uid) can pass
    through to its own run folder and cache, but list nothing. Everything in it that is not a
    job's own is 0600/0700 (database, tokens, server files)."""
    home.mkdir(parents=True, exist_ok=True)
    mode = PLANE_DIR_MODE if isolation.enabled else PRIVATE_DIR_MODE
    if stat.S_IMODE(home.stat().st_mode) != mode:
        home.chmod(mode)


def _submit_problems(spec: JobSpec) -> list[FieldProblem]:
    """Fields a submitted spec gives that the plane would otherwise ignore or guess at. Checked
    at submit, not in JobSpec, so a spec stored before still loads."""
    out: list[FieldProblem] = []
    if spec.workdir is not None and not os.path.isabs(spec.workdir):
        out.append(
            FieldProblem(
                "workdir",
                f"{spec.workdir!r} is relative: give an absolute path (the CLI and Client.submit(path) take a "
                "spec file's relative workdir from the file's folder; a request body has no folder to resolve "
                "it against, and the plane's own working folder is not the job's)",
            )
        )
    for key in sorted(SET_PER_ATTEMPT & spec.env.keys()):
        out.append(
            FieldProblem(
                f"env.{key}",
                "set by sluice for each attempt (the GPUs placement gives it, a replica's rank in its gang); "
                "a value here would be replaced: leave it out",
            )
        )
    for i, mount in enumerate(spec.datasets):
        if any(m.name == mount.name for m in spec.datasets[:i]):
            out.append(FieldProblem(f"datasets.{i}.name", f"dataset {mount.name!r} is named twice: name it once"))
        if "access" in mount.model_fields_set:
            out.append(
                FieldProblem(
                    f"datasets.{i}.access",
                    "sluice reads no access hint: the job chooses how it reads a dataset "
                    "(sluice.sdk.dataset(name): random access; dataset(name, streaming=True): sequential); "
                    "leave access out",
                )
            )
    if spec.array is not None:
        for key in ("id", "index"):
            if key in spec.array.model_fields_set:
                out.append(FieldProblem(f"array.{key}", "set by sluice on each job of the array: leave it out"))
        if spec.resume_from is not None:
            out.append(
                FieldProblem(
                    "array",
                    "an array cannot start from one job's checkpoint (resume_from): its jobs would share it; "
                    "submit the jobs to resume one by one",
                )
            )
    if spec.qoe is not None and spec.qoe.deadline_s is not None and spec.qoe.deadline is not None:
        out.append(
            FieldProblem(
                "qoe",
                "deadline_s and deadline both set a deadline; give one of them "
                "(deadline_s: seconds after submission, deadline: a time)",
            )
        )
    return out


def _too_big(spec: JobSpec, sizes: list[tuple[str, float, int, int]]) -> list[FieldProblem]:
    """What of one replica (and of the whole gang) no node of `sizes` (name, cpu, gpus,
    memory MiB; 0 memory = unknown) could ever hold, each with the largest node's capacity."""
    if not sizes:
        return []
    res = spec.resources
    cpu_node = max(sizes, key=lambda s: s[1])
    gpu_node = max(sizes, key=lambda s: s[2])
    mem_node = max(sizes, key=lambda s: s[3])
    out = []
    if res.cpu.min > cpu_node[1] + 1e-9:
        out.append(
            FieldProblem(
                "resources.cpu.min", f"{res.cpu.min:g} CPU; the largest node ({cpu_node[0]}) has {cpu_node[1]:g}"
            )
        )
    if res.gpus > gpu_node[2]:
        out.append(
            FieldProblem("resources.gpus", f"{res.gpus} GPUs; the largest node ({gpu_node[0]}) has {gpu_node[2]}")
        )
    if res.memory_mb and mem_node[3] and res.memory_mb > mem_node[3]:
        out.append(
            FieldProblem(
                "resources.memory_mb", f"{res.memory_mb} MiB; the largest node ({mem_node[0]}) has {mem_node[3]} MiB"
            )
        )
    fits = [
        s
        for s in sizes
        if s[1] + 1e-9 >= res.cpu.min and s[2] >= res.gpus and not (res.memory_mb and s[3] and res.memory_mb > s[3])
    ]
    if not out and not fits:
        out.append(FieldProblem("resources", "no single node has this much CPU, GPU and memory together"))
    total = sum(s[1] for s in sizes)
    if not out and res.replicas.min * res.cpu.min > total + 1e-9:
        out.append(
            FieldProblem(
                "resources.replicas.min",
                f"{res.replicas.min} replicas × {res.cpu.min:g} CPU; the whole cluster has {total:g} CPU",
            )
        )
    return out


def make_engine(settings: Settings) -> Engine:
    """The engine named by settings.engine. Imported lazily: Ray is heavy."""
    if settings.engine == "local":
        from sluice.engine.local import LocalEngine

        return LocalEngine(settings)
    if settings.engine == "ray":
        from sluice.engine.ray import RayEngine

        return RayEngine(settings)
    raise ValueError(f"engine: unknown engine {settings.engine!r}; choose local or ray")


def _no_such_replica(job_id: str, world: int) -> SpecError:
    """A rank the job does not have, said for a job of one replica as for a gang."""
    if world == 1:
        return SpecError([FieldProblem("replica", f"job {job_id} runs one replica: give no replica (or 0)")])
    return SpecError([FieldProblem("replica", f"job {job_id} runs {world} replicas: give 0 to {world - 1}")])


def _failed(job: JobRecord) -> bool:
    """Ended other than Succeeded: a job `after` it would never start."""
    return job.phase.terminal and job.phase != Phase.SUCCEEDED


class ControlPlane:
    def __init__(
        self, settings: Settings, store: Store, engine: Engine, policy: Policy, isolation: Isolation | None = None
    ) -> None:
        """`isolation`: whether tenants' jobs run as their own uids; default: settings.isolation
        resolved against this process's privilege (IsolationUnavailable for `on` without it)."""
        self.settings = settings
        self.store = store
        self.engine = engine
        self.isolation = isolation or detect_isolation(settings.isolation)
        self._job_users: dict[str, JobUser] = {}
        self.datasets = DatasetService(
            store,
            settings.cache,
            engine=engine,
            guard=guard_from(settings),
            run_as=self.job_user if self.isolation.enabled else None,
            job_python=settings.job_python,
            slots=CopySlots(
                settings.dataset_source_ops_per_tenant,
                settings.dataset_source_ops,
                what="{} dataset source operations (listing a source at create, warming)",
                settings=("dataset_source_ops_per_tenant", "dataset_source_ops"),
            ),
            list_timeout_s=settings.dataset_list_timeout_s,
        )
        self.controller = Controller(
            store,
            engine,
            policy,
            launch_env=lambda job: self.datasets.launch_env(job.tenant, [d.name for d in job.spec.datasets]),
            dataset_bytes=lambda job: self.datasets.dataset_bytes(job.tenant, [d.name for d in job.spec.datasets]),
            # Engines whose nodes do not share this machine's disk (Ray) name a shared root.
            checkpoint_root=str(engine.checkpoint_root or settings.runs_dir),
            restart_backoff_s=settings.restart_backoff_s,
            run_as=self.job_user if self.isolation.enabled else None,
            preempt_min_runtime_s=settings.preempt_min_runtime_s,
            failpoints=Failpoints.parse(settings.failpoints),
        )
        self.queues = QueueService(store, self.controller)
        self.priorities = PriorityClassService(store, self.controller)
        self._resume_slots = CopySlots(settings.resume_copies_per_tenant, settings.resume_copies)
        self._delete_slots = CopySlots(
            settings.job_deletes_per_tenant,
            settings.job_deletes,
            what="{} job deletes (removing run folders)",
            settings=("job_deletes_per_tenant", "job_deletes"),
        )
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.recovery: RecoveryReport | None = None
        self.store_problem: str | None = None
        """Why the store takes no writes now (None when it does): the API's 503 reason."""
        self.lost_database: str | None = None
        """Set when another plane took the database from this one (a PostgreSQL restart ended
        this plane's session and lock), or what its engine acts through (`EngineTaken`: a Ray
        namespace whose record was lost with its node): this plane stops reconciling, /healthz
        says why, every change is refused."""
        self.health = self._attach_health(settings) if settings.health_enabled else None
        self.retention = self._retention(settings)

    def _retention(self, settings: Settings) -> RetentionThread | None:
        """Ended jobs forgotten `job_retention_days` after they finished, usage's held time
        `usage_retention_days` after its hour (control/retention.py); None when both are 0
        (keep everything)."""
        if settings.job_retention_days <= 0 and settings.usage_retention_days <= 0:
            return None
        book = self.controller.book
        retention = Retention(
            self.store,
            settings.job_retention_days * DAY_S,
            usage_keep_s=settings.usage_retention_days * DAY_S,
            live=book.live,
            get=book.get,
            lock=self.controller.lock,
            remove_folders=self.engine.remove_run_folders if isinstance(self.engine, RunFolders) else None,
            forgot=self.controller.forget_disk_use,  # tenants' disk caps: their ended jobs' sums moved
            # A plane that lost its database acts on nothing; one stopping closes its store.
            halted=lambda: self.lost_database is not None or self._stop.is_set(),
        )
        return RetentionThread(retention, clock=self.engine.clock)

    def _attach_health(self, settings: Settings) -> object:
        """The node health monitor as a controller observer (issue 5). Virtual nodes share
        this machine's disk, network and memory, so only their own cores' KPIs are judged."""
        from sluice.health.monitor import MACHINE_WIDE, MonitorConfig

        ignore = ("jobs", *MACHINE_WIDE) if settings.virtual_nodes > 1 else ("jobs",)
        cfg = MonitorConfig(
            train_samples=settings.health_train_samples,
            q=settings.health_q,
            threshold=settings.health_threshold,
            dspot_depth=settings.health_dspot_depth,
            change_grace_s=settings.health_change_grace_s,
            retrain_growth=settings.health_retrain_growth,
            history_samples=settings.health_history_samples,
            ignore=ignore,
            models_dir=settings.home / "health",
        )
        return self.attach_health(cfg)

    def attach_health(self, config: MonitorConfig) -> HealthMonitor:
        """A node health monitor watching every round, resumed from the store's node health;
        its cordons are decisions the controller executes like any other."""
        monitor = HealthMonitor(config, saved=self.controller.saved_nodes())
        self.controller.add_observer(monitor)
        return monitor

    @classmethod
    def from_settings(cls, settings: Settings) -> ControlPlane:
        isolation = detect_isolation(settings.isolation)
        secure_home(settings.home, isolation)
        store = open_store(settings.db_url)
        engine = make_engine(settings)
        policy = make_policy(settings.policy, interval_s=settings.policy_interval_s)
        return cls(settings, store, engine, policy, isolation)

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
        if self.retention is not None:
            self.retention.start()

    def _loop(self) -> None:
        interval = self.settings.reconcile_interval_s
        keep_claim = getattr(self.store, "keep_claim", None)
        while not self._stop.is_set():
            t0 = time.monotonic()
            launches = self.controller.launches
            try:
                # Before every round that may write: a PostgreSQL restart ends the session that
                # held this plane's lock (`SqlStore.keep_claim`), and a second plane may claim the
                # database as soon as it is back. Checked every 5 s, this plane went on launching
                # jobs for up to 5 s beside that one; now it is one query a round (~0.3 ms).
                if keep_claim is not None:
                    keep_claim()
                self.controller.step()
                if self.store_problem is not None:
                    log.warning("the store takes writes again; reconciling")
                    self.store_problem = None
            except StoreUnavailable as err:  # reads still work; retry each interval until writes do
                if self.store_problem != str(err):
                    log.error("reconcile paused: %s", err)
                self.store_problem = str(err)
            except (StoreInUse, EngineTaken) as err:  # two planes acting on one set of jobs would run them twice
                self.lost_database = str(err)
                log.error("reconcile stopped: %s; this plane no longer acts on its jobs (stop it)", err)
                return
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
        if self.retention is not None:
            self.retention.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:  # the last seconds of held time (a round writes it every few seconds)
            with self.controller.lock:
                self.controller.flush_held_time(force=True)
        except Exception:
            log.warning("could not save the last held time at stop", exc_info=True)
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
            if self.isolation.enabled:
                self.job_user(name)
        return out

    def job_user(self, tenant: str) -> JobUser:
        """The uid/gid the tenant's jobs run as: assigned once from the configured range,
        recorded in the store, never reused by another tenant."""
        user = self._job_users.get(tenant)
        if user is None:
            s = self.settings
            uid = self.store.assign_uid(tenant, s.job_uid_min, s.job_uid_max, time.time())
            user = self._job_users[tenant] = JobUser(uid, uid)
        return user

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

    def create_tenant(self, caller: TenantRecord, spec: TenantSpec, force: bool = False) -> tuple[TenantRecord, str]:
        """Without isolation every job runs as the plane's user and can read every other
        tenant's data, so a second non-admin tenant is refused unless the admin `force`s it."""
        self._require_admin(caller)
        if self.store.get_tenant(spec.name) is not None:
            raise Conflict(f"tenant {spec.name!r} already exists")
        if self.store.tenant_deleted_at(spec.name) is not None:
            raise Conflict(_DELETED_NAME.format(name=spec.name))
        if not self.isolation.enabled and not spec.admin and not force:
            others = [t.name for t in self.store.list_tenants() if not t.admin]
            if others:
                # Off by setting, root would not help: the setting is what to change.
                fix = (
                    "Start the plane with isolation auto or on (SLUICE_ISOLATION; it is off by setting)"
                    if self.settings.isolation == "off"
                    else "Run the plane as root (or with the capabilities in docs/security.md)"
                )
                raise Conflict(
                    f"tenant {spec.name!r} not created: {self.isolation.reason}; tenant {others[0]!r} exists. "
                    f"{fix}, or force it (`sluice tenant create --force`, API ?force=true) to accept that tenants "
                    "are not isolated"
                )
        if self.isolation.enabled:
            try:
                self.job_user(spec.name)
            except ValueError as err:
                raise Conflict(f"tenant {spec.name!r} not created: {err}") from None
        token = new_token()
        rec = TenantRecord(
            spec.name,
            hash_token(token),
            admin=spec.admin,
            max_running_jobs=spec.max_running_jobs,
            weight=spec.weight,
            created_at=time.time(),
            max_priority=spec.max_priority,
            max_disk_mb=spec.max_disk_mb,
        )
        try:
            self.store.create_tenant(rec)
        except DuplicateError:  # another admin's create or delete of that name came first
            if self.store.tenant_deleted_at(spec.name) is not None:
                raise Conflict(_DELETED_NAME.format(name=spec.name)) from None
            raise Conflict(f"tenant {spec.name!r} already exists") from None
        return rec, token

    def usage(
        self, caller: TenantRecord, since: float | None = None, tenant: str | None = None, all_tenants: bool = False
    ) -> list[TenantUsage]:
        """What each tenant's jobs held and ran in the hours from the one `since` falls in, and
        its jobs submitted at or after `since` (control/usage.py): an admin's for every tenant
        (or `tenant`), anyone else's for itself only (403 naming another, or asking for all of
        them: `sluice usage --all` with a tenant's token printed its own as if every tenant's).
        Read from the store: live jobs' figures trail the book by up to one flush
        (`save_progress_every_s`, 5 s)."""
        if not caller.admin and all_tenants:
            raise Forbidden(f"all: every tenant's usage needs an admin token; this one is tenant {caller.name}'s")
        if not caller.admin and tenant not in (None, caller.name):
            raise Forbidden(f"tenant: you may see only {caller.name!r}'s usage")
        who = tenant if caller.admin else caller.name
        out = by_tenant(self.store.job_usage(tenant=who, since=since), self.store.held_time(tenant=who, since=since))
        names = {who} if who is not None else {t.name for t in self.store.list_tenants()}
        disk = self.store.ended_disk_mb(names)
        with self.controller.lock:
            for job in self.controller.book.live():
                if job.disk_mb and job.tenant in names:
                    disk[job.tenant] = disk.get(job.tenant, 0.0) + job.disk_mb
        mine = {u.tenant: u for u in out}
        for name, mb in disk.items():  # a tenant with folders but no job or hour in the window too
            mine.setdefault(name, TenantUsage(name)).disk_mb = round(mb, 3)
        return [mine[name] for name in sorted(mine)]

    def list_tenants(
        self, caller: TenantRecord, *, after: str | None = None, limit: int | None = None
    ) -> list[TenantRecord]:
        self._require_admin(caller)
        return self.store.list_tenants(after=after, limit=limit)

    def delete_tenant(self, caller: TenantRecord, name: str) -> None:
        """Delete a tenant for good: its token stops working, its queue grants go, its uid and
        its name are retired (never given to another tenant). Refused while it has unfinished
        jobs (suspended ones included) or datasets, naming them: they would otherwise outlive
        it with nobody to cancel or delete them. Its finished jobs stay, for an admin to read."""
        self._require_admin(caller)
        if self.store.get_tenant(name) is None:
            raise NotFound(f"tenant {name!r} not found")
        if name in BUILT_IN_TENANTS:
            raise Conflict(f"the built-in {name} tenant cannot be deleted: {BUILT_IN_TENANTS[name]}")
        if name == caller.name:
            raise Conflict("a tenant cannot delete itself")
        # Under the controller's lock from the check to the delete: a submit of this tenant
        # creates its job under the same lock, after checking the tenant is still there
        # (`_create_job`), so no job can slip in between and outlive its tenant.
        with self.controller.lock:
            live = [j.id for j in self.controller.book.live() if j.tenant == name]
            if live:
                raise Conflict(
                    f"tenant {name!r} still has {len(live)} unfinished job(s): {some(live)}; cancel them "
                    "(`sluice job cancel ID` with the admin token, SLUICE_TOKEN=$(cat $SLUICE_HOME/admin.token), "
                    "or the tenant's) or let them finish first"
                )
            datasets = [d.name for d in self.store.list_datasets(tenant=name)]
            if datasets:
                raise Conflict(
                    f"tenant {name!r} still owns {len(datasets)} dataset(s): {some(datasets)}; delete them first "
                    f"(`sluice dataset rm NAME --tenant {name}`)"
                )
            now = time.time()
            self.store.delete_tenant(name, now)
            self.store.release_uid(name, now)
            self._job_users.pop(name, None)

    # ---------------------------------------------------------------- jobs

    def submit(self, caller: TenantRecord, spec: JobSpec) -> JobRecord:
        tenant = spec.tenant or caller.name
        if tenant != caller.name and not caller.admin:
            raise Forbidden(f"tenant: you may submit only as {caller.name!r}")
        if tenant != caller.name and self.store.get_tenant(tenant) is None:
            raise NotFound(f"tenant {tenant!r} not found")
        problems = _submit_problems(spec)
        if problems:
            raise SpecError(problems)
        spec = self._confined(spec)
        missing = self.datasets.missing(tenant, [d.name for d in spec.datasets])
        if missing:
            raise SpecError(
                [
                    FieldProblem("datasets", f"no dataset named {n!r} for tenant {tenant!r}; create it first")
                    for n in missing
                ]
            )
        self._check_capacity(spec)
        cap = None if caller.admin else self.settings.max_unfinished_jobs_per_tenant
        self._check_unfinished(tenant, cap)  # before a --resume-from copy, and again at create
        self.queues.check_submit(tenant, spec)
        self._check_after(tenant, spec)
        asked, spec = spec, self.priorities.resolve(spec)
        if not caller.admin:  # an admin could raise the cap anyway: its own submissions are not capped
            self.priorities.check_cap(tenant, caller.max_priority, asked, spec)
        if spec.array is not None:
            jobs = self._create_array(tenant, spec, cap=cap)
        elif spec.resume_from is None:
            jobs = [self._create_job(tenant, spec, cap=cap)]
        else:
            jobs = [self._submit_resuming(tenant, spec, spec.resume_from, cap=cap)]
        if spec.priority_class is not None:  # `sluice job why` says where the priority came from
            with self.controller.lock:
                for job in jobs:
                    self.controller.book.note(
                        job.id, "priority", f"priority class {spec.priority_class}: priority {spec.priority}"
                    )
        self.wake()
        return jobs[0]

    def _check_after(self, tenant: str, spec: JobSpec) -> None:
        """The jobs a new job is to start after: its own tenant's (another tenant's reads as
        no such job, in the words `resume_from` uses), and none of `after` already ended other
        than Succeeded — such a job could never start (a 409 saying which). Those of
        `after_any` may have ended any way."""
        if not spec.predecessors:
            return
        book = self.controller.book
        problems: list[FieldProblem] = []
        ended: list[JobRecord] = []
        with self.controller.lock:
            for field, deps in (("after", spec.after), ("after_any", spec.after_any)):
                for i, dep in enumerate(deps):
                    job = book.get(dep)
                    count = array_count(book, dep, tenant) if job is None else None
                    if count is not None:
                        members = [book.get(f"{dep}-{k}") for k in range(count)]  # an array: every job of it
                        ended += [m for m in members if m is not None and field == "after" and _failed(m)]
                    elif job is None or job.tenant != tenant:
                        problems.append(FieldProblem(f"{field}.{i}", f"you have no job or job array {dep!r}"))
                    elif field == "after" and _failed(job):
                        ended.append(job)
        if problems:
            raise SpecError(problems)
        if ended:
            raise Conflict(f"after: job {ended[0].id} ended {ended[0].phase}; a job started after it would never start")

    def _check_unfinished(self, tenant: str, cap: int | None, adding: int = 1) -> None:
        """A 409 unless the tenant's jobs that have not ended stay within `cap` with `adding`
        more (None: no cap)."""
        if cap is None:
            return
        with self.controller.lock:
            n = self.controller.book.live_count(tenant)
        if n + adding > cap:
            most = f"the most it may have (max_unfinished_jobs_per_tenant {cap})"
            said = most if adding == 1 else f"and an array of {adding} more would pass {most}"
            raise Conflict(
                f"tenant {tenant!r} has {n} jobs that have not ended, {said}; wait for some to end, or cancel some"
            )

    def _create_array(self, tenant: str, spec: JobSpec, cap: int | None) -> list[JobRecord]:
        """Every job of an array (`<id>-0` to `<id>-<count-1>`), each with its index, or none:
        all are made under one hold of the controller's lock, after checking the tenant's cap
        for all of them, and written in one transaction (a crash or a failed write halfway
        through left the jobs before it on disk, which then ran)."""
        assert spec.array is not None
        array_id = f"j-{uuid.uuid4().hex[:10]}"
        specs = [
            (
                spec.model_copy(update={"array": spec.array.model_copy(update={"id": array_id, "index": i})}),
                f"{array_id}-{i}",
            )
            for i in range(spec.array.count)
        ]
        with self.controller.lock:
            self._may_still_create(tenant, spec, cap, adding=spec.array.count)
            return self.controller.submit_many(tenant, specs)

    def _create_job(self, tenant: str, spec: JobSpec, job_id: str | None = None, cap: int | None = None) -> JobRecord:
        """The job, on disk, if it may still be made when it is (`_may_still_create`)."""
        with self.controller.lock:
            self._may_still_create(tenant, spec, cap)
            return self.controller.submit(tenant, spec, job_id=job_id)

    def _may_still_create(self, tenant: str, spec: JobSpec, cap: int | None, adding: int = 1) -> None:
        """Checked again under the controller's lock, in which the job is made (as
        `delete_tenant` checks and deletes, and retention chooses and deletes): a tenant
        deleted while its submit was on its way (a `--resume-from` copy takes a while) gets
        no job; nor one whose queue or priority class was deleted, or grant revoked,
        meanwhile; nor one whose
        concurrent submits took the last of its `cap` unfinished jobs, nor one whose `after`
        no longer holds (a job it names forgotten by retention meanwhile:
        it keeps only what a live job waits for)."""
        if self.store.get_tenant(tenant) is None:
            raise NotFound(f"tenant {tenant!r} not found (deleted while this job was being submitted)")
        # `delete_queue` checks for the queue's jobs under this lock: a queue deleted since
        # `check_submit` would get a job that waits for ever ("queue q does not exist").
        self.queues.check_granted(tenant, spec.queue)
        self.priorities.check_exists(spec)  # its delete checks for its jobs under this lock too
        self._check_unfinished(tenant, cap, adding=adding)
        self._check_after(tenant, spec)

    def _submit_resuming(self, tenant: str, spec: JobSpec, source_id: str, cap: int | None = None) -> JobRecord:
        """A job that starts from another job's newest checkpoint: the same tenant's only
        (another tenant's job reads as no such job), one that no longer runs. The checkpoints
        are copied into the new job's folder before the job exists, so its first attempt (the
        SDK's `load()`) finds them."""
        with self.controller.lock:
            source = self.controller.book.get(source_id)
        if source is not None and source.tenant == tenant:
            self._check_disk_room(tenant)
        if source is None or source.tenant != tenant:
            # A 422 naming the field, as a spec's other references (queue, priority_class) are;
            # the same words whether the job does not exist or is another tenant's.
            raise SpecError([FieldProblem("resume_from", f"you have no job {source_id!r}")])
        if not (source.phase.terminal or source.phase == Phase.SUSPENDED):
            raise Conflict(
                f"resume_from: job {source_id} is {source.phase}; only a finished, cancelled or suspended job's "
                "checkpoint can be resumed from"
            )
        job_id = f"j-{uuid.uuid4().hex[:10]}"
        src_dir = self.controller.checkpoint_dir(source)
        dst_dir = checkpoint_dir(spec.checkpoint.location, self.controller.checkpoint_root, job_id)
        try:
            base = checkpoint_base(
                spec.checkpoint.location, self.controller.checkpoint_root, self.settings.checkpoint_roots
            )
        except SpecError:
            raise Conflict(
                f"resume_from: checkpoint.location {spec.checkpoint.location} is no longer inside the admin's "
                "checkpoint_roots"
            ) from None
        try:
            owner = self.job_user(tenant) if self.isolation.enabled else None
            if base == self.controller.checkpoint_root and "://" not in base:
                os.makedirs(base, mode=PLANE_DIR_MODE, exist_ok=True)  # the plane's own folder
            with self._resume_slots.slot(tenant):
                newest = copy_checkpoints(
                    src_dir, dst_dir, owner=owner, dst_base=base, max_bytes=self.settings.resume_max_copy_mb << 20
                )
        except OSError as err:
            raise Conflict(f"resume_from: could not copy job {source_id}'s checkpoints: {err}") from None
        if newest is None:  # asked to resume: starting from step 0 instead would be a silent surprise
            raise Conflict(
                f"resume_from: job {source_id} left no checkpoint to resume from; submit without "
                "resume_from to start from step 0"
            )
        # the copy is in the new job's folder before it runs: its disk, against max_disk_mb
        copied = None if "://" in dst_dir else folder_size([Path(dst_dir)]).bytes / MIB
        with self.controller.lock:
            job = self._create_job(tenant, spec, job_id=job_id, cap=cap)
            path, step = newest
            self.controller.book.note(job.id, "resume", f"starts from job {source_id}'s checkpoint at step {step}")
            return self.controller.book.observe(job.id, checkpoint=path, checkpoint_step=step, disk_mb=copied) or job

    def _check_disk_room(self, tenant: str) -> None:
        """A 409 before a `--resume-from` copy of a tenant whose jobs' folders hold its
        `max_disk_mb` or more: the plane writes the copy as soon as asked, where the hold of
        pending jobs (`Controller._hold_for_tenant_disk`) comes too late (red team s29)."""
        rec = self.store.get_tenant(tenant)
        cap = None if rec is None else rec.max_disk_mb
        if not cap:
            return
        with self.controller.lock:
            used = self.controller.tenant_disk_mb(tenant)
        if used >= cap:
            raise Conflict(
                f"resume_from: tenant {tenant}'s jobs hold {used:,.0f} MiB, its max_disk_mb of {cap} MiB or more, "
                "and a copy of a checkpoint would add to it (every job's run folder counts, ended jobs' until "
                "deleted: sluice job delete)"
            )

    def _check_capacity(self, spec: JobSpec) -> None:
        """Refuse (422, naming the field and the largest node) a job no node can ever hold.

        Replicas beyond what the engine runs are always refused. Node sizes are refused only
        when the cluster cannot grow (settings.allow_unschedulable off); with it on, the job
        is accepted and waits with an `Unschedulable:` reason (policy/parts/placement.py)."""
        res = spec.resources
        most = self.engine.capabilities.max_replicas
        problems: list[FieldProblem] = []
        for field, n in (("min", res.replicas.min), ("max", res.replicas.max or 0)):
            # max too: a range past the engine's limit is one a policy would grow a job into
            # only to have every such resize refused (walk s32 elasticwalk).
            if n > most:
                problems.append(
                    FieldProblem(
                        f"resources.replicas.{field}",
                        f"{n} replicas, but the {self.engine.name} engine runs at most {most} per job",
                    )
                )
                break
        memory = self._memory_problem(spec)
        if memory is not None:
            problems.append(memory)
        if not self.settings.allow_unschedulable:
            with self.controller.lock:
                known = [self.controller.node(name) for name in self.controller.node_names()]
                sizes = [(n.name, n.cpu, n.gpus, n.memory_mb) for n in known if n is not None]
            if not sizes:  # before the first round: ask the engine
                sizes = [(n.name, n.cpu, n.gpus, n.memory_mb) for n in self.engine.nodes()]
            problems += _too_big(spec, sizes)
        if problems:
            raise SpecError(problems)

    def _memory_problem(self, spec: JobSpec) -> FieldProblem | None:
        """A memory_mb nothing here can enforce is refused, never run unlimited: the engine
        cannot (no memory controller on the local machine), or no node it reported can
        (every Ray node labelled memory-limits=none)."""
        if not spec.resources.memory_mb:
            return None
        why = None
        if not self.engine.capabilities.memory_limits:
            why = f"the {self.engine.name} engine cannot enforce memory limits on this machine"
        else:
            labels = self._node_labels()
            if labels and all(lab.get("memory-limits") == "none" for lab in labels):
                why = f"no node of the {self.engine.name} engine can enforce memory limits"
        if why is None:
            return None
        return FieldProblem(
            "resources.memory_mb",
            f"{spec.resources.memory_mb} MiB cannot be enforced: {why} (no writable cgroup memory "
            "controller; see the server log). Remove memory_mb or run sluice where cgroups are writable.",
        )

    def _node_labels(self) -> list[dict[str, str]]:
        """Each known node's labels (the controller's view, else the engine's list)."""
        with self.controller.lock:
            known = [self.controller.node(name) for name in self.controller.node_names()]
        labels = [dict(n.labels or {}) for n in known if n is not None]
        return labels or [dict(n.labels) for n in self.engine.nodes()]

    def _confined(self, spec: JobSpec) -> JobSpec:
        """The spec with its checkpoint location confined (control/confine.py) and canonical: a
        location outside the job's run folder and the admin's checkpoint_roots is a 422."""
        location = confine_checkpoint(spec.checkpoint.location, self.settings.checkpoint_roots)
        if location == spec.checkpoint.location:
            return spec
        return spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"location": location})})

    def _visible(self, caller: TenantRecord, job: JobRecord | None, job_id: str) -> JobRecord:
        if job is None or (job.tenant != caller.name and not caller.admin):
            raise NotFound(f"job {job_ref(job_id)} not found{self.array_hint(caller, job_id) if job is None else ''}")
        return job

    def array_hint(self, caller: TenantRecord, job_id: str) -> str:
        """'' or, where `job_id` is the id of one of the caller's job arrays (what `sluice job
        submit` prints for one), what to ask for instead: `job get/logs/why` of it said only
        "not found". Another tenant's array reads as none, as its jobs do."""
        with self.controller.lock:
            try:
                _first, count = self._array(caller, job_id)
            except NotFound:
                return ""
        return (
            f": {job_id} is a job array, whose jobs are {job_id}-0 to {job_id}-{count - 1} "
            f"(sluice job list --array {job_id})"
        )

    def get_job(self, caller: TenantRecord, job_id: str) -> JobRecord:
        with self.controller.lock:
            job = self.controller.book.get(job_id)
        return self._visible(caller, job, job_id)

    def list_jobs(
        self,
        caller: TenantRecord,
        phases: Iterable[Phase] | None = None,
        *,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        """The caller's jobs in (submitted_at, id) order, strictly after `after`, at most
        `limit`; fewer than `limit` means there are no more (JobBook.query)."""
        tenant = None if caller.admin else caller.name
        with self.controller.lock:
            return self.controller.book.query(tenant=tenant, phases=phases, after=after, limit=limit)

    def job_counts(self) -> dict[str, int]:
        """Jobs by phase, every tenant (metrics)."""
        return self.store.count_jobs()

    def cancel(self, caller: TenantRecord, job_id: str) -> JobRecord:
        job = self.get_job(caller, job_id)
        if job.phase.terminal:
            raise Conflict(f"job {job_id} already {job.phase}")
        done = self.controller.cancel(job_id, f"cancelled by tenant {caller.name}")
        self.wake()
        return done

    def _array(self, caller: TenantRecord, array_id: str) -> tuple[JobRecord, int]:
        """An array's first job and how many jobs it has: the caller's own array, or any
        tenant's for an admin; NotFound for another tenant's, as for one that never was (or
        was forgotten). Call under the controller's lock."""
        book = self.controller.book
        first = book.get(f"{array_id}-0")
        owner = first.tenant if first is not None and caller.admin else caller.name
        count = array_count(book, array_id, owner)
        if first is None or count is None:
            raise NotFound(f"job array {job_ref(array_id)} not found")
        return first, count

    def array_jobs(
        self,
        caller: TenantRecord,
        array_id: str,
        phases: Iterable[Phase] | None = None,
        *,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        """The jobs of one job array (`GET /v1/jobs?array=`), in `list_jobs`' (submitted_at, id)
        order — an array's jobs were all submitted at once, so by id —, strictly after `after`,
        at most `limit`. Each job is read by its id, never the tenant's whole list, and only
        the ones listed: with `phases`, the phases of the array's jobs are read first (one
        read of two columns), not every record whole. Another tenant's array is a NotFound
        (an admin sees any)."""
        ph = set(phases) if phases is not None else None
        out: list[JobRecord] = []
        with self.controller.lock:
            book = self.controller.book
            first, count = self._array(caller, array_id)
            ids = sorted(f"{array_id}-{k}" for k in range(count))
            ids = [i for i in ids if after is None or (first.submitted_at, i) > after]
            if ph is not None:  # by phase first: an ended job is read whole only if it is listed
                phase = self.store.job_phases([i for i in ids if not book.is_live(i)])
                phase |= {j.id: j.phase for j in (book.get(i) for i in ids if book.is_live(i)) if j is not None}
                ids = [i for i in ids if phase.get(i) in ph]
            for job_id in ids:
                job = book.get(job_id)
                if job is None or (ph is not None and job.phase not in ph):
                    continue
                out.append(job)
                if limit and len(out) >= limit:
                    break
        return out

    def cancel_array(self, caller: TenantRecord, array_id: str) -> list[JobRecord]:
        """Cancel every job of a job array that has not ended, in one call (`sluice job cancel
        --array`): the caller's own array, or any tenant's for an admin; another tenant's reads
        as none (404). Returns the jobs cancelled, lowest index first (none when all had ended)."""
        with self.controller.lock:
            book = self.controller.book
            _, count = self._array(caller, array_id)
            live = [j for j in (book.get(f"{array_id}-{k}") for k in range(count)) if j is not None]
        done = [
            self.controller.cancel(j.id, f"cancelled with its array by tenant {caller.name}")
            for j in live
            if not j.phase.terminal
        ]
        self.wake()
        return done

    def delete_job(self, caller: TenantRecord, job_id: str) -> JobsDeleted:
        """Forget an ended job now, as retention would later (`sluice job delete`): its record and
        events, then its run folders (log, files, checkpoints kept there). The caller's own job,
        or any tenant's for an admin; another tenant's is a NotFound, as one that never was. A
        Conflict, deleting nothing, for a job that has not ended, a job of an array (an array
        goes whole: retention and `after` find one by its first job), or one a live job starts
        after."""
        with self._delete_slots.slot(caller.name):  # its folders go inside the request: bounded
            with self.controller.lock:
                job = self._visible(caller, self.controller.book.get(job_id), job_id)
                a = job.spec.array
                if a is not None and a.id is not None:
                    raise Conflict(
                        f"job {job_id} is one of job array {a.id}, which is deleted whole: "
                        f"sluice job delete --array {a.id}"
                    )
                gone = self._delete_ended(caller, [job_id], job.tenant)
            return self._remove_folders_of(caller, gone)

    def delete_array(self, caller: TenantRecord, array_id: str) -> JobsDeleted:
        """Forget every job of a job array once all of them ended (`sluice job delete --array`);
        a Conflict while any has not, or while a live job starts after the array or one of its
        jobs. Another tenant's array is a NotFound."""
        with self._delete_slots.slot(caller.name):
            with self.controller.lock:
                first, count = self._array(caller, array_id)
                ids = [f"{array_id}-{k}" for k in range(count)]
                gone = self._delete_ended(caller, ids, first.tenant, array_id)
            return self._remove_folders_of(caller, gone)

    def _delete_ended(
        self, caller: TenantRecord, ids: list[str], tenant: str, array_id: str | None = None
    ) -> list[str]:
        """Delete the records and events of `ids` (one tenant's) if every one has ended and no
        live job waits for any of them; the ids deleted. Under the controller's lock, which a
        submit naming them in `after` takes to check that they still exist."""
        if self.lost_database is not None:
            # Its book is stale: another plane's live jobs (and the jobs waiting for one) are
            # not in it, so an ended job would be judged on nothing (retention halts too).
            raise Unavailable(
                "another plane took this plane's database or Ray namespace; it no longer acts on jobs: ask the plane "
                "now serving"
            )
        book = self.controller.book
        what = f"job array {array_id}" if array_id else f"job {ids[0]}"
        running = [i for i in ids if book.is_live(i)]
        if running:
            job = book.get(running[0])
            phase = job.phase if job is not None else "not ended"
            more = f" (and {len(running) - 1} more of the array)" if len(running) > 1 else ""
            cancel = f"--array {array_id}" if array_id else running[0]
            raise Conflict(
                f"job {running[0]} is {phase}{more}: only an ended job can be deleted; cancel it first "
                f"(sluice job cancel {cancel})"
            )
        names = {*ids, *([array_id] if array_id else [])}
        waiting = [j for j in book.live() if names.intersection(j.spec.predecessors)]
        if waiting:
            w = waiting[0]
            who = f"job {w.id}" if w.tenant == caller.name or caller.admin else "a job"
            raise Conflict(
                f"{who} starts after {what}, which cannot be deleted before that job has ended "
                "(cancel that job first, or wait)"
            )
        if isinstance(self.engine, RunFolders):
            lingering = self.engine.still_running(ids)
            if lingering:
                job = book.get(lingering[0])
                phase = job.phase if job is not None else "ended"
                raise Conflict(
                    f"job {lingering[0]} is {phase}, but its processes on its node have not exited yet "
                    "(sluice is stopping them): try again in a few seconds"
                )
        deleted = self.store.delete_jobs(ids)
        self.controller.forget_disk_use()  # their folders no longer count against max_disk_mb
        if deleted:
            self.store.append_event(
                self.engine.clock(),
                "deleted",
                f"{what} of tenant {tenant} deleted by {caller.name}",
                data={"jobs": deleted, "tenant": tenant},
            )
            log.info("%s of tenant %s deleted by %s", what, tenant, caller.name)
        return ids if deleted else []

    def _remove_folders_of(self, caller: TenantRecord, ids: list[str]) -> JobsDeleted:
        """Remove the deleted jobs' run folders (outside the controller's lock: a big folder
        takes a while); trouble with one is logged and leaves the others."""
        folders = 0
        if isinstance(self.engine, RunFolders):
            for job_id in ids:
                try:
                    folders += self.engine.remove_run_folders(job_id)
                except Exception:
                    log.exception("could not remove the run folders of deleted job %s", job_id)
        return JobsDeleted(ids, folders)

    def suspend(self, caller: TenantRecord, job_id: str) -> JobRecord:
        """Suspend a job: it checkpoints, stops and gives its quota back until resumed."""
        job = self.get_job(caller, job_id)
        if job.phase.terminal:
            raise Conflict(f"job {job_id} already {job.phase}")
        done = self.controller.suspend(job_id, f"suspended by tenant {caller.name}")
        self.wake()
        return done

    def resume(self, caller: TenantRecord, job_id: str) -> JobRecord:
        """Resume a suspended job: it is admitted again and starts from its checkpoint. Refused
        (409) while its priority is above its tenant's max_priority (lowered since submit), or
        while its tenant is no longer granted its queue: admission would never take it."""
        job = self.get_job(caller, job_id)
        if job.phase != Phase.SUSPENDED:
            raise Conflict(f"job {job_id} is {job.phase}, not Suspended")
        cap = None if caller.admin else caller.max_priority
        if cap is not None and job.spec.priority > cap:  # the cap may have been lowered since submit
            raise Conflict(
                f"priority: job {job_id} has priority {job.spec.priority}, above tenant {caller.name!r}'s "
                f"max_priority {cap}; submit it again with a priority of {cap} or lower and "
                f"`--resume-from {job_id}` to go on from its checkpoint"
            )
        if not self.queues.granted(job.tenant, job.spec.queue):
            raise Conflict(
                f"job {job_id} stays Suspended: queue {job.spec.queue} is no longer granted to tenant {job.tenant}; "
                f"an admin may grant it again (sluice queue grant {job.spec.queue} {job.tenant}), or cancel the job"
            )
        done = self.controller.resume(job_id, f"resumed by tenant {caller.name}")
        self.wake()
        return done

    # ---------------------------------------------------------------- queues

    def list_queues(self, caller: TenantRecord) -> list[QueueStatus]:
        """Every queue for an admin; the queues granted to the caller otherwise."""
        return self.queues.statuses(None if caller.admin else caller.name)

    def create_queue(self, caller: TenantRecord, spec: QueueSpec) -> QueueStatus:
        self._require_admin(caller)
        return self.queues.create(spec)

    def update_queue(self, caller: TenantRecord, name: str, patch: QueuePatch) -> QueueStatus:
        """Change a queue's quotas, cohort or weight live: the next round admits by them."""
        self._require_admin(caller)
        out = self.queues.update(name, patch)
        self.wake()
        return out

    def delete_queue(self, caller: TenantRecord, name: str) -> None:
        self._require_admin(caller)
        with self.controller.lock:
            self.queues.delete(name)

    def grant_queue(self, caller: TenantRecord, name: str, grant: GrantSpec) -> QueueStatus:
        self._require_admin(caller)
        return self.queues.grant(name, grant.tenant, grant.granted)

    # ---------------------------------------------------------------- priority classes

    def list_priority_classes(self, caller: TenantRecord) -> list[PriorityClass]:
        """Every class, for every tenant: a tenant needs the names to submit with them (as
        Kubernetes lets every user read PriorityClasses)."""
        return self.priorities.list()

    def create_priority_class(self, caller: TenantRecord, spec: PriorityClassSpec) -> PriorityClass:
        self._require_admin(caller)
        return self.priorities.create(spec)

    def delete_priority_class(self, caller: TenantRecord, name: str) -> None:
        self._require_admin(caller)
        self.priorities.delete(name)

    def update_tenant(self, caller: TenantRecord, name: str, patch: TenantPatch) -> TenantRecord:
        """Change a tenant's fair-share weight, job limit or disk cap (0 removes either) or
        priority cap (an explicit None removes it) live. A lower cap refuses later submits and resumes; jobs
        already accepted keep their priority."""
        self._require_admin(caller)
        rec = self.store.get_tenant(name)
        if rec is None:
            raise NotFound(f"tenant {name!r} not found")
        if patch.weight is not None:
            rec.weight = patch.weight
        if patch.max_running_jobs is not None:
            rec.max_running_jobs = patch.max_running_jobs or None
        if patch.max_disk_mb is not None:
            rec.max_disk_mb = patch.max_disk_mb or None
        if "max_priority" in patch.model_fields_set:  # an explicit null removes the cap
            rec.max_priority = patch.max_priority
        try:
            self.store.save_tenant(rec)
        except DuplicateError:  # deleted meanwhile
            raise NotFound(f"tenant {name!r} not found") from None
        self.wake()
        return rec

    def why(self, caller: TenantRecord, job_id: str, *, skip: int = 0, limit: int | None = None) -> list[EventRecord]:
        """The job's events past its first `skip`, oldest first (JobBook.events)."""
        self.get_job(caller, job_id)
        return self.controller.book.events(job_id, skip=skip, limit=limit)

    def progress(self, caller: TenantRecord, job_id: str) -> ProgressSignals | None:
        self.get_job(caller, job_id)
        with self.controller.lock:
            return self.controller.progress(job_id)

    def log_path(self, caller: TenantRecord, job_id: str) -> Path | None:
        """The log the job's current (or newest) attempt writes."""
        self.get_job(caller, job_id)
        p = self.engine.log_path(job_id)
        return Path(p) if p else None

    def job_folder(
        self, caller: TenantRecord, job_id: str, replica: int | None = None
    ) -> tuple[Path, JobUser | None, dict[str, Path]]:
        """Where the job's files are (`sluice job files`, control/job_files.py): the run folder
        of replica `replica` (default rank 0, a job of one replica: its own) of its newest
        attempt; under tenant isolation the uid whose files may be handed out; and its default
        checkpoint folder when that is not in the run folder (Ray's shared checkpoint root:
        {"checkpoints": <root>/<job>}). NotFound for another tenant's job, one that never
        started, or an engine that keeps no run folders (the simulator); a 422 naming
        `replica` for a rank the job does not have."""
        job = self.get_job(caller, job_id)
        world = job.allocation.replicas if job.allocation is not None else job.spec.resources.replicas.min
        rank = 0 if replica is None else replica
        if rank >= world:
            raise _no_such_replica(job_id, world)
        if not isinstance(self.engine, RunFolders):
            raise NotFound(f"job {job_id}: this engine ({self.engine.name}) keeps no job files")
        folder = self.engine.run_folder(job_id, rank)
        if folder is None:
            raise NotFound(f"job {job_id} has no files yet: it has not started")
        if self.isolation.enabled and self.store.get_tenant(job.tenant) is None:
            # Its uid was released with it: asking for it would give the deleted tenant a new one
            # (a uid spent), under which none of its files would be its own anyway (red team s29).
            raise NotFound(f"job {job_id}: its tenant {job.tenant!r} was deleted, and its files are not served")
        owner = self.job_user(job.tenant) if self.isolation.enabled else None
        elsewhere: dict[str, Path] = {}
        ckpt = Path(self.controller.checkpoint_dir(job))
        if job.spec.checkpoint.location is None and ckpt.parent != Path(folder) and "://" not in str(ckpt):
            elsewhere[ckpt.name] = ckpt.parent
        return Path(folder), owner, elsewhere

    def replica_log(self, caller: TenantRecord, job_id: str, rank: int) -> Path | None:
        """One replica's log of the job's newest attempt (Ray keeps one per replica); a 422
        naming `replica` for a rank the job does not have, or on an engine whose one log
        already holds every replica's lines."""
        job = self.get_job(caller, job_id)
        world = job.allocation.replicas if job.allocation is not None else job.spec.resources.replicas.min
        if rank >= world:
            raise _no_such_replica(job_id, world)
        if not getattr(self.engine, "logs_per_replica", False):
            if world == 1:  # one replica: its log is the job's
                return self.log_path(caller, job_id)
            raise SpecError(
                [
                    FieldProblem(
                        "replica",
                        "this engine writes every replica into the job's one log, each line prefixed [rankK]; "
                        "leave replica out",
                    )
                ]
            )
        p = self.engine.replica_log(job_id, rank)
        return Path(p) if p else None

    def replica_logs(self, caller: TenantRecord, job_id: str) -> list[Path | None] | None:
        """Every replica's log of the job's newest attempt, rank order (None for a replica
        that has none yet); None where the engine writes every replica into the job's one log
        (the local engine: that log already is the all-replicas view)."""
        job = self.get_job(caller, job_id)
        if not getattr(self.engine, "logs_per_replica", False):
            return None
        world = job.allocation.replicas if job.allocation is not None else job.spec.resources.replicas.min
        many = getattr(self.engine, "replica_logs", None)  # one lookup for them all (Ray)
        found = many(job_id, world) if many else [self.engine.replica_log(job_id, rank) for rank in range(world)]
        return [Path(p) if p else None for p in found]

    def earlier_logs(self, caller: TenantRecord, job_id: str) -> list[Path]:
        """Logs of the job's earlier attempts that `log_path` does not hold, oldest first
        (Ray: the nodes a moved job ran on before)."""
        self.get_job(caller, job_id)
        return [Path(p) for p in self.engine.earlier_logs(job_id)]

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

    def cordon(self, caller: TenantRecord, node: str, reason: str) -> CordonOutcome:
        """Cordon the node; say which jobs that moves off it (the ones starting or running
        there, as the controller stops them) and whether any other node can take them."""
        self._require_admin(caller)
        with self.controller.lock:  # no round between counting and cordoning
            view = self.controller.view()
            if node not in view.nodes:
                raise NotFound(f"node {node!r} not found")
            moved = sorted(j.id for j in view.jobs_on(node) if j.phase in (Phase.STARTING, Phase.RUNNING))
            others = sum(1 for n in view.nodes.values() if n.name != node and n.schedulable)
            try:
                self.controller.set_node_health(
                    node, NodeHealth.CORDONED, reason or "cordoned by operator", by="operator"
                )
            except KeyError:
                raise NotFound(f"node {node!r} not found") from None
            return CordonOutcome(moved, others)

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
        if kind == "memory":
            with self.controller.lock:
                st = self.controller.node(node)
            if st is not None and st.memory_mb and memory_mb > st.memory_mb:
                # More than the node has would take the machine (every node of it), not one node.
                raise SpecError(
                    [FieldProblem("memory_mb", f"{memory_mb} MiB is more than node {node}'s {st.memory_mb} MiB")]
                )
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
        if self.controller.node(node) is None:
            raise NotFound(f"node {node!r} not found")
        if not isinstance(self.engine, FaultInjector):
            raise Conflict(f"the {self.engine.name} engine cannot inject faults")
        return self.engine
