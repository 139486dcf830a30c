"""Queues as admins manage them and tenants see them: create, change live, delete, grant, and
each queue's usage, borrowing and backlog. Admission itself is `policy/admission.py`; it
reads the queues from the store every round, so a change here applies at the next round.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from sluice.control.controller import Controller, job_demand
from sluice.control.errors import Conflict, NotFound, some
from sluice.model import JobRecord, Phase
from sluice.model.queue import (
    DEFAULT_QUEUE,
    RESOURCES,
    Amounts,
    Limits,
    QueueConfig,
    Reclaim,
    RuntimeLimit,
    WithinQueue,
    fmt,
)
from sluice.policy.admission import QuotaLedger
from sluice.spec import JobSpec, QueuePatch, QueueSpec, QuotaSpec, SpecError
from sluice.spec.errors import FieldProblem
from sluice.store import Store
from sluice.store.base import QueueRecord

HOLDS_QUOTA = (Phase.QUEUED, Phase.STARTING, Phase.RUNNING, Phase.STOPPING)

_EPS = 1e-9

_DEMAND_FIELDS = {"cores": "resources.cpu.min", "memory_mb": "resources.memory_mb", "gpus": "resources.gpus"}
"""The job spec field behind each quota resource (a job's `jobs` demand is the job itself)."""


@dataclass(frozen=True)
class QueueStatus:
    """A queue with what it holds now: what `sluice queue list` shows."""

    name: str
    cohort: str | None
    weight: float
    nominal: dict[str, float]
    borrowing_limit: dict[str, float]
    lending_limit: dict[str, float]
    reclaim_within_cohort: str
    """Preemption for this queue's jobs (docs/queues.md): any, lower_priority or never."""
    within_queue: str
    max_runtime_s: float | None
    """Most seconds one of its jobs may run; None: no limit of the queue's."""
    tenants: list[str] | None
    """Tenants granted it; None: every tenant (the default queue)."""
    usage: dict[str, float]
    borrowed: dict[str, float]
    admitted: int
    pending: int
    summary: str
    created_at: float


def _limits(q: QuotaSpec) -> Limits:
    return Limits.from_dict(q.model_dump())


def limit_problems(cfg: QueueConfig) -> list[FieldProblem]:
    """Lending and borrowing limits that cannot mean anything (Kueue refuses the same): a
    lending limit above the nominal quota or on a resource with none, a lending or borrowing
    limit on a queue in no cohort (it can never lend or borrow; a limit of 0 says what is true
    anyway, so a CLI user clears one with 0), a borrowing limit on a resource with no quota."""
    out: list[FieldProblem] = []
    for r in RESOURCES:
        nom, lend, borrow = cfg.nominal.get(r), cfg.lending_limit.get(r), cfg.borrowing_limit.get(r)
        if lend is not None and nom is None:
            out.append(
                FieldProblem(
                    f"lending_limit.{r}",
                    f"queue {cfg.name} has no nominal {r} quota, so it has no {r} to lend; give nominal.{r} too",
                )
            )
        elif lend is not None and nom is not None and lend > nom + _EPS:
            out.append(
                FieldProblem(
                    f"lending_limit.{r}",
                    f"{fmt(lend)} is more than queue {cfg.name}'s nominal {r} quota ({fmt(nom)}): a queue lends "
                    "only its own unused nominal quota",
                )
            )
        elif lend is not None and lend > 0 and cfg.cohort is None:
            out.append(
                FieldProblem(
                    f"lending_limit.{r}",
                    f"queue {cfg.name} is in no cohort, so it lends to no one; give it a cohort, "
                    f"or leave lending_limit.{r} out (or 0)",
                )
            )
        if borrow is None or borrow <= 0:
            continue  # a limit of 0 says what is true anyway
        if cfg.cohort is None:
            out.append(
                FieldProblem(
                    f"borrowing_limit.{r}",
                    f"queue {cfg.name} is in no cohort, so it can never borrow; give it a cohort, "
                    f"or leave borrowing_limit.{r} out (or 0)",
                )
            )
        elif nom is None:
            out.append(
                FieldProblem(
                    f"borrowing_limit.{r}",
                    f"queue {cfg.name} has no nominal {r} quota, so its {r} are not limited and there is "
                    f"nothing to borrow above; give nominal.{r} too",
                )
            )
    return out


def config_of(spec: QueueSpec) -> QueueConfig:
    return QueueConfig(
        name=spec.name,
        cohort=spec.cohort,
        nominal=_limits(spec.nominal),
        borrowing_limit=_limits(spec.borrowing_limit),
        lending_limit=_limits(spec.lending_limit),
        weight=spec.weight,
        reclaim_within_cohort=Reclaim(spec.preemption.reclaim_within_cohort),
        within_queue=WithinQueue(spec.preemption.within_queue),
        max_runtime_s=spec.max_runtime_s,
    )


class QueueService:
    def __init__(self, store: Store, controller: Controller) -> None:
        self.store = store
        self.controller = controller

    # ------------------------------------------------------------------ admin

    def create(self, spec: QueueSpec) -> QueueStatus:
        if spec.name == DEFAULT_QUEUE or self.store.get_queue(spec.name) is not None:
            raise Conflict(f"queue {spec.name!r} already exists; change it with `sluice queue set`")
        cfg = config_of(spec)
        problems = limit_problems(cfg)
        if problems:
            raise SpecError(problems)
        self.store.save_queue(QueueRecord(cfg, time.time()))
        return self.status(spec.name)

    def update(self, name: str, patch: QueuePatch) -> QueueStatus:
        rec = self.store.get_queue(name)
        if rec is None:
            if name != DEFAULT_QUEUE:
                raise NotFound(f"queue {name!r} not found")
            rec = QueueRecord(QueueConfig(DEFAULT_QUEUE), time.time())
        changes: dict[str, Any] = {}
        if patch.cohort is not None:
            changes["cohort"] = patch.cohort or None
        for field in ("nominal", "borrowing_limit", "lending_limit"):
            q = getattr(patch, field)
            if q is not None:
                changes[field] = _limits(q)
        if patch.weight is not None:
            changes["weight"] = patch.weight
        if patch.preemption is not None:
            changes["reclaim_within_cohort"] = Reclaim(patch.preemption.reclaim_within_cohort)
            changes["within_queue"] = WithinQueue(patch.preemption.within_queue)
        if "max_runtime_s" in patch.model_fields_set:  # an explicit null removes the limit
            changes["max_runtime_s"] = patch.max_runtime_s
        new = replace(rec.config, **changes)
        # The queue as it would be is checked; a problem it already had (stored before these
        # checks existed) does not block an unrelated change.
        had = {p.field for p in limit_problems(rec.config)}
        problems = [p for p in limit_problems(new) if p.field not in had]
        if problems:
            raise SpecError(problems)
        self.store.save_queue(QueueRecord(new, rec.created_at))
        return self.status(name)

    def delete(self, name: str) -> None:
        if name == DEFAULT_QUEUE:
            raise Conflict(
                "the built-in default queue cannot be deleted: every tenant submits to it; "
                "change its quota with `sluice queue set default` instead"
            )
        if self.store.get_queue(name) is None:
            raise NotFound(f"queue {name!r} not found")
        live = [j.id for j in self.controller.book.live() if j.spec.queue == name]
        if live:
            raise Conflict(
                f"queue {name!r} still has {len(live)} unfinished job(s): {some(live)}; cancel them (`sluice job "
                "cancel ID` with the admin token) or let them finish first (a suspended job counts until cancelled)"
            )
        self.store.delete_queue(name)

    def grant(self, name: str, tenant: str, granted: bool) -> QueueStatus:
        if name == DEFAULT_QUEUE:
            raise Conflict("the default queue is granted to every tenant")
        if self.store.get_queue(name) is None:
            raise NotFound(f"queue {name!r} not found")
        if self.store.get_tenant(tenant) is None:
            raise NotFound(f"tenant {tenant!r} not found")
        self.store.grant_queue(name, tenant, granted)
        return self.status(name)

    # ------------------------------------------------------------------ tenants

    def check_submit(self, tenant: str, spec: JobSpec) -> None:
        """A 422 naming `queue` unless the tenant may submit to it. A queue that does not
        exist and one not granted read the same, so queue names do not leak."""
        name = spec.queue
        self.check_granted(tenant, name)
        problems = self.never_fits(spec)
        limit = self.controller.queues().get(name, QueueConfig(name)).max_runtime_s
        if limit is not None and spec.max_runtime_s is not None and spec.max_runtime_s > limit:
            problems.append(
                FieldProblem(
                    "max_runtime_s",
                    f"{spec.max_runtime_s:g}s is more than queue {name} lets a job run ({limit:g}s): ask for "
                    "that or less, or leave max_runtime_s out to get the queue's",
                )
            )
        if problems:
            raise SpecError(problems)

    def check_granted(self, tenant: str, name: str) -> None:
        """A 422 naming `queue` unless the queue exists and is granted to the tenant; one that
        does not exist reads the same as one not granted. Checked at submit and again under
        the controller's lock where the job is made, so a queue deleted (or a grant revoked)
        while a submit was on its way gets no job."""
        if name != DEFAULT_QUEUE and (self.store.get_queue(name) is None or not self.granted(tenant, name)):
            raise SpecError(
                [FieldProblem("queue", f"no queue named {name!r} is granted to tenant {tenant!r}; ask an admin")]
            )

    def runtime_limits(self, jobs: Iterable[JobRecord]) -> dict[str, RuntimeLimit | None]:
        """Per job id, the seconds it may run and whose limit that is (its own max_runtime_s or
        its queue's), as the controller holds it to them; the queues read once."""
        queues = self.controller.queues()
        return {
            j.id: queues.get(j.spec.queue, QueueConfig(j.spec.queue)).runtime_limit(j.spec.max_runtime_s) for j in jobs
        }

    def granted(self, tenant: str, name: str) -> bool:
        """Whether `tenant` may use queue `name` now (`default`: every tenant)."""
        return name == DEFAULT_QUEUE or tenant in self.store.queue_grants().get(name, [])

    def never_fits(self, spec: JobSpec) -> list[FieldProblem]:
        """A problem per resource the job needs more of than its queue can ever hold by its own
        settings: its nominal quota, plus its borrowing limit in a cohort. (Where only what the
        rest of its cohort lends stands in the way, the job is accepted; admission holds it
        saying it can never be admitted while the quotas stay as they are.)"""
        queues = self.controller.queues()
        if spec.queue not in queues:
            return []
        ledger = QuotaLedger(queues, Amounts())
        demand = job_demand(spec)
        out: list[FieldProblem] = []
        for r in RESOURCES:
            need, top = demand.get(r), ledger.ceiling(spec.queue, r, cohort=False)
            if need <= 0 or top is None or need <= top + _EPS:
                continue
            quota = ledger.quota_text(spec.queue, r, cohort=False)
            if r == "jobs":
                out.append(FieldProblem("queue", f"queue {spec.queue} can never admit a job: its quota is {quota}"))
                continue
            n = spec.resources.replicas.min
            each = {"cores": spec.resources.cpu.min, "memory_mb": spec.resources.memory_mb, "gpus": spec.resources.gpus}
            per = f" ({fmt(float(each[r] or 0))} x {n} replicas)" if n > 1 else ""
            out.append(
                FieldProblem(
                    _DEMAND_FIELDS[r],
                    f"the job needs {fmt(need)} {r}{per}, but queue {spec.queue} can never give it more than "
                    f"{fmt(top)} ({quota})",
                )
            )
        return out

    def statuses(self, tenant: str | None = None) -> list[QueueStatus]:
        """Every queue (tenant None: an admin) or those granted to `tenant`. A tenant is told
        it is granted the queue, never which other tenants are: tenants are mutually untrusted,
        and the names of those sharing a queue are theirs (as reasons name no other tenant's
        job); the queue's usage and backlog are shown whole, as admission judges by them."""
        grants = self.store.queue_grants()
        names = sorted(self.controller.queues())
        if tenant is not None:
            names = [n for n in names if n == DEFAULT_QUEUE or tenant in grants.get(n, [])]
        out = [self._status(n, grants) for n in names]
        if tenant is None:
            return out
        return [q if q.tenants is None else replace(q, tenants=[tenant]) for q in out]

    def status(self, name: str) -> QueueStatus:
        return self._status(name, self.store.queue_grants())

    def _status(self, name: str, grants: dict[str, list[str]]) -> QueueStatus:
        with self.controller.lock:
            queues = self.controller.queues()
            live = self.controller.book.live()
        ledger = QuotaLedger(queues, Amounts())
        admitted = pending = 0
        for j in live:
            if j.spec.queue not in queues:
                continue
            if j.phase in HOLDS_QUOTA:
                ledger.add(j.spec.queue, job_demand(j.spec))
                admitted += j.spec.queue == name
            elif j.phase == Phase.PENDING:
                pending += j.spec.queue == name
        cfg = queues[name]
        rec = self.store.get_queue(name)
        use = ledger.usage[name]
        return QueueStatus(
            name=name,
            cohort=cfg.cohort,
            weight=cfg.weight,
            nominal=cfg.nominal.to_dict(),
            borrowing_limit=cfg.borrowing_limit.to_dict(),
            lending_limit=cfg.lending_limit.to_dict(),
            reclaim_within_cohort=str(cfg.reclaim_within_cohort),
            within_queue=str(cfg.within_queue),
            max_runtime_s=cfg.max_runtime_s,
            tenants=None if name == DEFAULT_QUEUE else grants.get(name, []),
            usage={r: use.get(r) for r in RESOURCES},
            borrowed={r: ledger.borrowed(name, r) for r in RESOURCES if ledger.borrowed(name, r) > 0},
            admitted=admitted,
            pending=pending,
            summary=ledger.summary(name),
            created_at=rec.created_at if rec else 0.0,
        )
