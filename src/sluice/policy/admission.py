"""Admission: which pending jobs get their queue's quota now, which wait (and why), and
which admitted jobs give quota back so that a job entitled to it can run.

Pure: plain values in (queues, each job's demand and state, tenants' weights and job
limits), decisions out, each with its reason. The controller executes them through the
job book; the local, Ray and simulated engines all run this same code.

The model is Kueue's ClusterQueue and cohort:

- a job's demand is what it is guaranteed, for all its replicas at once (gang admission:
  `cpu.min` x replicas cores, memory x replicas, GPUs x replicas, one job) — admitted whole
  or not at all, so no job ever holds part of a gang's quota;
- a queue admits within its nominal quota; in a cohort it may also borrow what the other
  queues lend (their unused nominal quota up to their lending limit), up to its own
  borrowing limit;
- the cohort's spare capacity goes by weighted dominant-resource fairness: the queue with
  the lowest dominant share / weight picks first, and within a queue the tenant with the
  lowest dominant share / weight (then priority, then submission order);
- a job that fits its queue's nominal quota but finds the cohort lent out *reclaims*: jobs
  of borrowing queues are preempted (lowest priority and newest first) until it fits. A job
  that does not fit may also preempt lower-priority jobs of its own queue, and lower-priority
  jobs of queues that are borrowing (other queues' borrowers are taken first, as Kueue
  orders candidates). Preemption only happens when it makes the job fit, and
  never to a job that has run less than `preempt_min_runtime_s` since it was placed (no
  thrashing). Each queue may turn either kind off (`reclaim_within_cohort`, `within_queue`,
  Kueue's names): its jobs then wait for the quota holders to finish.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from sluice.model.queue import (
    DEFAULT_QUEUE,
    RESOURCES,
    SHARE_RESOURCES,
    Amounts,
    QueueConfig,
    Reclaim,
    WithinQueue,
    fmt,
)

_EPS = 1e-9


class Stage(StrEnum):
    """Where a job stands as far as quota is concerned."""

    PENDING = "pending"  # waits for admission: holds no quota
    QUEUED = "queued"  # admitted, not placed: holds quota, can give it back at once
    ACTIVE = "active"  # placed (starting or running): holds quota
    STOPPING = "stopping"  # being stopped: holds quota until its process exits


@dataclass(frozen=True, slots=True)
class AdmissionJob:
    id: str
    tenant: str
    queue: str
    priority: int
    submitted_at: float
    demand: Amounts
    stage: Stage
    running_since: float | None = None
    """When its current attempt was placed (ACTIVE jobs): the preemption rate limit."""
    preempted: bool = False
    """A STOPPING job that is being preempted (so its quota will come back)."""
    may_preempt: bool = True
    """False for a job whose priority class says `preemption: never`: it goes ahead of lower
    priorities in line but never preempts them for being higher (reclaiming its queue's own
    lent nominal quota is not a priority matter and still happens)."""


@dataclass(frozen=True, slots=True)
class TenantLimits:
    weight: float = 1.0
    max_jobs: int | None = None
    """The tenant's own cap on admitted jobs (TenantSpec.max_running_jobs)."""


@dataclass(frozen=True, slots=True)
class Admit:
    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Hold:
    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Evict:
    """Give the job's quota back: a queued job returns to Pending at once, a running one is
    preempted through its checkpoint and returns to admission when it has stopped.

    `reason` goes into the victim's own record, which its tenant reads: it names the job it
    gives way to only when that job is the same tenant's, and a queue only when the victim's
    tenant is granted it. `detail` is the whole story (both jobs, both queues) for the
    operator's log."""

    job_id: str
    reason: str
    for_job: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Stall:
    """An admitted job that waits for room and could have it by preempting lower-priority jobs
    of its queue, but may not (its priority class or its queue says never) or not yet (they
    ran less than `preempt_min_runtime_s`): why, to add to the reason it waits with."""

    job_id: str
    reason: str


AdmissionDecision = Admit | Hold | Evict | Stall

Grants = Mapping[str, Collection[str]]
"""queue -> the tenants granted it. The `default` queue is open to every tenant."""


def granted(grants: Grants | None, tenant: str, queue: str) -> bool:
    """Whether `tenant` may use `queue` (grants None: no grants are kept, everyone may)."""
    return grants is None or queue == DEFAULT_QUEUE or tenant in grants.get(queue, ())


class QuotaLedger:
    """Usage per queue and what each cohort lends, with the checks admission asks of them."""

    def __init__(self, queues: Mapping[str, QueueConfig], capacity: Amounts) -> None:
        self.queues = queues
        self.capacity = capacity
        self.usage: dict[str, Amounts] = {q: Amounts() for q in queues}
        self.members: dict[str, list[str]] = {}
        for q in queues.values():
            self.members.setdefault(self.cohort_key(q.name), []).append(q.name)

    def copy(self) -> QuotaLedger:
        c = QuotaLedger.__new__(QuotaLedger)
        c.queues, c.capacity, c.members = self.queues, self.capacity, self.members
        c.usage = dict(self.usage)
        return c

    def cohort_key(self, q: str) -> str:
        cohort = self.queues[q].cohort
        return f"cohort:{cohort}" if cohort else f"queue:{q}"

    def add(self, q: str, d: Amounts) -> None:
        self.usage[q] = self.usage[q].plus(d)

    def remove(self, q: str, d: Amounts) -> None:
        self.usage[q] = self.usage[q].minus(d)

    def pool(self, q: str, r: str) -> tuple[float, float]:
        """(lent out, lendable) for resource r in q's cohort."""
        used = total = 0.0
        for m in self.members[self.cohort_key(q)]:
            cfg = self.queues[m]
            lend, guar = cfg.lendable(r), cfg.guaranteed(r)
            if lend is None or guar is None:
                continue
            total += lend
            used += max(0.0, self.usage[m].get(r) - guar)
        return used, total

    def borrowed(self, q: str, r: str) -> float:
        nom = self.queues[q].nominal.get(r)
        return 0.0 if nom is None else max(0.0, self.usage[q].get(r) - nom)

    def borrowing(self, q: str) -> bool:
        return any(self.borrowed(q, r) > _EPS for r in RESOURCES)

    def in_nominal(self, q: str, d: Amounts) -> bool:
        cfg = self.queues[q]
        return all(
            cfg.nominal.get(r) is None or self.usage[q].get(r) + d.get(r) <= cfg.nominal.get(r) + _EPS  # type: ignore[operator]
            for r in RESOURCES
        )

    def shortfall(self, q: str, d: Amounts) -> tuple[list[str], str | None]:
        """The resources that keep demand `d` out of queue q and why (([], None): it fits)."""
        cfg = self.queues[q]
        short: list[str] = []
        why: str | None = None
        for r in RESOURCES:
            need = d.get(r)
            nom = cfg.nominal.get(r)
            if need <= 0 or nom is None:
                continue
            have = self.usage[q].get(r)
            new = have + need
            if new <= nom + _EPS and cfg.cohort is None:
                continue
            head = f"queue {q}: {r} {fmt(have)}/{fmt(nom)} nominal, needs {fmt(need)} more"
            if cfg.cohort is None:
                short.append(r)
                why = why or f"{head}; it is in no cohort, so it cannot borrow"
                continue
            limit = cfg.borrowing_limit.get(r)
            if limit is not None and new > nom + limit + _EPS:
                short.append(r)
                why = why or f"{head}; borrowing limit {fmt(limit)} from cohort {cfg.cohort} would be exceeded"
                continue
            used, total = self.pool(q, r)
            guar = cfg.guaranteed(r) or 0.0
            after = used - max(0.0, have - guar) + max(0.0, new - guar)
            if after > total + _EPS:
                short.append(r)
                why = why or f"{head}; {self._pool_text(q, r)}"
        return short, why

    def _pool_text(self, q: str, r: str) -> str:
        """'cohort lab has 0 of the 2 cores its queues share free: 2 used by the queues they
        belong to, 0 borrowed'. What a cohort shares is its queues' nominal quota less what
        each keeps for itself (its lending limit); a queue's own use of that part and other
        queues' borrowing both take from it. Only a quota lowered while jobs hold it makes
        the two add up to more than is shared, and then the text says so."""
        own = lent = total = 0.0
        for m in self.members[self.cohort_key(q)]:
            cfg = self.queues[m]
            lend, guar, nom = cfg.lendable(r), cfg.guaranteed(r), cfg.nominal.get(r)
            if lend is None or guar is None or nom is None:
                continue
            total += lend
            use = self.usage[m].get(r)
            own += max(0.0, min(use, nom) - guar)
            lent += max(0.0, use - nom)
        spare = max(0.0, total - own - lent)
        over = " (more than it shares now: a quota was lowered while jobs held it)" if own + lent > total + _EPS else ""
        return (
            f"cohort {self.queues[q].cohort} has {fmt(spare)} of the {fmt(total)} {r} its queues share free: "
            f"{fmt(own)} used by the queues they belong to, {fmt(lent)} borrowed{over}"
        )

    def ceiling(self, q: str, r: str, *, cohort: bool = True) -> float | None:
        """The most of resource r queue q can ever hold as its queues are configured now (None:
        no limit): its nominal quota, plus in a cohort what it may borrow — its borrowing
        limit and, with `cohort`, what the other queues of its cohort lend at most. With
        `cohort` False, a queue in a cohort with no borrowing limit has no ceiling of its own."""
        cfg = self.queues[q]
        nom = cfg.nominal.get(r)
        if nom is None:
            return None
        if cfg.cohort is None:
            return nom
        limit = cfg.borrowing_limit.get(r)
        if not cohort:
            return None if limit is None else nom + limit
        others = sum(self.queues[m].lendable(r) or 0.0 for m in self.members[self.cohort_key(q)] if m != q)
        return nom + (others if limit is None else min(limit, others))

    def quota_text(self, q: str, r: str, *, cohort: bool = True) -> str:
        """What bounds `ceiling(q, r)`: 'cores 0.5 nominal, in no cohort', 'cores 1 nominal +
        borrowing limit 1', 'cores 1 nominal + at most 2 that cohort lab lends'."""
        cfg = self.queues[q]
        text = f"{r} {fmt(cfg.nominal.get(r) or 0.0)} nominal"
        if cfg.cohort is None:
            return f"{text}, in no cohort"
        limit = cfg.borrowing_limit.get(r)
        others = sum(self.queues[m].lendable(r) or 0.0 for m in self.members[self.cohort_key(q)] if m != q)
        if limit is not None and (not cohort or limit <= others + _EPS):
            return f"{text} + borrowing limit {fmt(limit)}"
        return f"{text} + at most {fmt(others)} that cohort {cfg.cohort} lends"

    def never(self, q: str, d: Amounts) -> str | None:
        """Why demand `d` can never be admitted to queue q while its quota (and its cohort's)
        stays as it is, or None. Preempting anyone would not help such a job."""
        for r in RESOURCES:
            need, top = d.get(r), self.ceiling(q, r)
            if need > 0 and top is not None and need > top + _EPS:
                return (
                    f"can never be admitted while queue {q}'s quota is {self.quota_text(q, r)}: "
                    f"it needs {fmt(need)} {r}; an admin may raise the quota (sluice queue set), or cancel the job"
                )
        return None

    def describe(self, q: str, d: Amounts | None = None) -> str:
        """'queue research: cores 10/8 nominal, borrowing 2 of 4 from cohort lab': the quota'd
        resources q uses or `d` demands (all of them when it uses none), for reasons."""
        parts = [self._resource(q, r) for r in self._quotaed(q) if self._involved(q, r, d)]
        parts = parts or [self._resource(q, r) for r in self._quotaed(q)]
        return f"queue {q}: " + ("; ".join(parts) if parts else "no quota")

    def summary(self, q: str) -> str:
        """What `sluice queue create/set/get` say of q, without its name: every quota'd
        resource with its usage, borrowing and lending limits, its cohort and weight, e.g.
        'cores 0/8 nominal (+4 borrowable, lends at most 2); gpus 0/4 nominal; cohort lab,
        weight 2'."""
        cfg = self.queues[q]
        parts = []
        for r in self._quotaed(q):
            text = self._resource(q, r)
            limit, lend = cfg.borrowing_limit.get(r), cfg.lending_limit.get(r)
            extra = []
            if cfg.cohort is not None and limit is not None and self.borrowed(q, r) <= _EPS:
                extra.append(f"+{fmt(limit)} borrowable")
            if cfg.cohort is not None and lend is not None:
                extra.append(f"lends at most {fmt(lend)}")
            parts.append(f"{text} ({', '.join(extra)})" if extra else text)
        tail = [f"cohort {cfg.cohort}"] if cfg.cohort else []
        if abs(cfg.weight - 1.0) > _EPS:
            tail.append(f"weight {fmt(cfg.weight)}")
        return "; ".join((parts or ["no quota"]) + ([", ".join(tail)] if tail else []))

    def _quotaed(self, q: str) -> list[str]:
        return [r for r in RESOURCES if self.queues[q].nominal.get(r) is not None]

    def _involved(self, q: str, r: str, d: Amounts | None) -> bool:
        return self.usage[q].get(r) > 0 or (d is not None and d.get(r) > 0)

    def _resource(self, q: str, r: str) -> str:
        """'cores 10/8 nominal, borrowing 2 of 4 from cohort lab' (r has a nominal quota)."""
        cfg = self.queues[q]
        text = f"{r} {fmt(self.usage[q].get(r))}/{fmt(cfg.nominal.get(r) or 0.0)} nominal"
        b = self.borrowed(q, r)
        if b > _EPS and cfg.cohort is not None:
            _used, total = self.pool(q, r)
            others = total - (cfg.lendable(r) or 0.0)
            limit = cfg.borrowing_limit.get(r)
            can = others if limit is None else min(limit, others)
            text += f", borrowing {fmt(b)} of {fmt(can)} from cohort {cfg.cohort}"
        return text

    def share(self, q: str, usage: Amounts | None = None) -> float:
        """Dominant share of q's cohort (or of the cluster) that `usage` (default q's) is."""
        u = usage if usage is not None else self.usage[q]
        best = 0.0
        for r in SHARE_RESOURCES:
            total = 0.0
            for m in self.members[self.cohort_key(q)]:
                nom = self.queues[m].nominal.get(r)
                if nom is None:
                    total = 0.0
                    break
                total += nom
            denom = total if total > 0 else self.capacity.get(r)
            if denom > 0:
                best = max(best, u.get(r) / denom)
        return best


def admit(
    queues: Mapping[str, QueueConfig],
    jobs: Sequence[AdmissionJob],
    *,
    tenants: Mapping[str, TenantLimits] | None = None,
    capacity: Amounts = Amounts(),
    now: float = 0.0,
    preempt_min_runtime_s: float = 60.0,
    grants: Grants | None = None,
) -> list[AdmissionDecision]:
    """Decide admission for every PENDING job in `jobs` (the others are what holds quota).

    `grants` (queue -> tenants; None: not kept, every tenant may use every queue): a pending
    job whose tenant is no longer granted its queue waits (a revoke stops new admissions;
    admitted jobs keep their quota and run on), and the reasons written into a job preempted
    for another tenant's job name that job's queue only if the victim's tenant is granted it."""
    tenants = tenants or {}
    ledger = QuotaLedger(queues, capacity)
    tenant_use: dict[str, Amounts] = {}
    tenant_jobs: dict[str, int] = {}
    admitted: list[AdmissionJob] = []
    for j in jobs:
        if j.stage == Stage.PENDING:
            continue
        admitted.append(j)
        tenant_use[j.tenant] = tenant_use.get(j.tenant, Amounts()).plus(j.demand)
        tenant_jobs[j.tenant] = tenant_jobs.get(j.tenant, 0) + 1
        if j.queue in queues:
            ledger.add(j.queue, j.demand)

    out: list[AdmissionDecision] = []
    lines: dict[str, dict[str, list[AdmissionJob]]] = {}
    for j in sorted((j for j in jobs if j.stage == Stage.PENDING), key=lambda j: (-j.priority, j.submitted_at, j.id)):
        if j.queue not in queues:
            out.append(Hold(j.id, f"queue {j.queue} does not exist (an admin deleted it); cancel and resubmit"))
            continue
        if not granted(grants, j.tenant, j.queue):
            out.append(
                Hold(
                    j.id,
                    f"queue {j.queue} is no longer granted to tenant {j.tenant}: the job waits until an admin "
                    "grants it again (sluice queue grant), or cancel it",
                )
            )
            continue
        never = ledger.never(j.queue, j.demand)
        if never is not None:
            out.append(Hold(j.id, f"queue {j.queue}: {never}"))
            continue
        lines.setdefault(j.queue, {}).setdefault(j.tenant, []).append(j)
    heads = {q: {t: 0 for t in by_tenant} for q, by_tenant in lines.items()}
    evicted: set[str] = set()

    def tenant_key(t: str) -> float:
        return _share(tenant_use.get(t, Amounts()), capacity) / max(tenants.get(t, TenantLimits()).weight, _EPS)

    while heads:
        # The queue furthest below its weighted fair share picks next (DRF across queues).
        q = min(heads, key=lambda q: (ledger.share(q) / max(queues[q].weight, _EPS), q))
        cands = [(t, lines[q][t][i]) for t, i in heads[q].items()]
        t, job = min(cands, key=lambda c: (-c[1].priority, tenant_key(c[0]), c[1].submitted_at, c[1].id))
        heads[q][t] += 1
        if heads[q][t] >= len(lines[q][t]):
            del heads[q][t]
            if not heads[q]:
                del heads[q]
        lim = tenants.get(t, TenantLimits())
        if lim.max_jobs is not None and tenant_jobs.get(t, 0) >= lim.max_jobs:
            out.append(Hold(job.id, f"tenant {t} is at its quota of {lim.max_jobs} admitted job(s)"))
            continue
        short, why = ledger.shortfall(q, job.demand)
        if short:
            plan = _reclaim(ledger, admitted, evicted, job, short, now, preempt_min_runtime_s, grants)
            if isinstance(plan, str):
                out.append(Hold(job.id, f"{why}{plan}"))
                continue
            freed_now = True
            for v, reason, detail in plan:
                evicted.add(v.id)
                out.append(Evict(v.id, reason, job.id, detail))
                if v.stage == Stage.QUEUED:
                    ledger.remove(v.queue, v.demand)
                    tenant_use[v.tenant] = tenant_use[v.tenant].minus(v.demand)
                    tenant_jobs[v.tenant] -= 1
                else:
                    freed_now = False
            if not freed_now:
                names = _victims([v for v, _, _ in plan], job.tenant)
                out.append(Hold(job.id, f"{why}; preempting {names} to make room (they checkpoint and stop first)"))
                continue
        ledger.add(q, job.demand)
        tenant_use[t] = tenant_use.get(t, Amounts()).plus(job.demand)
        tenant_jobs[t] = tenant_jobs.get(t, 0) + 1
        admitted.append(job)
        out.append(Admit(job.id, f"admitted to {ledger.describe(q, job.demand)}"))
    out += _preempt_for_capacity(queues, jobs, evicted, capacity, now, preempt_min_runtime_s)
    return out


def _victims(victims: Sequence[AdmissionJob], reader: str) -> str:
    """The jobs a job preempts, as its tenant (`reader`) may read them: its own by id, other
    tenants' only counted ('j-1a, j-2b and 2 jobs of other tenants')."""
    own = [v.id for v in victims if v.tenant == reader]
    others = len(victims) - len(own)
    if others:
        own.append(f"{others} job(s) of other tenants")
    return ", ".join(own[:-1]) + " and " + own[-1] if len(own) > 1 else own[0]


def _unlimited(cfg: QueueConfig) -> bool:
    """A queue with no quota at all (the built-in `default` until an admin gives it one)."""
    return not cfg.nominal.to_dict()


def _fits(d: Amounts, free: Amounts) -> bool:
    return all(d.get(r) <= free.get(r) + _EPS for r in SHARE_RESOURCES if d.get(r) > 0)


def capacity_preemption_possible(jobs: Iterable[AdmissionJob]) -> bool:
    """Whether `_preempt_for_capacity` could preempt anyone (or say why a job that may not
    preempt waits): some admitted, unplaced job has a higher priority than some placed job of
    its queue. False whenever priorities are all equal, so the controller skips admission then
    as it always did (the simulator's equal-priority benchmarks run exactly as before)."""
    low: dict[str, int] = {}
    high: dict[str, int] = {}
    for j in jobs:
        if j.stage == Stage.ACTIVE:
            low[j.queue] = min(low.get(j.queue, j.priority), j.priority)
        elif j.stage == Stage.QUEUED:
            high[j.queue] = max(high.get(j.queue, j.priority), j.priority)
    return any(q in low and low[q] < p for q, p in high.items())


def _preempt_for_capacity(
    queues: Mapping[str, QueueConfig],
    jobs: Sequence[AdmissionJob],
    evicted: set[str],
    capacity: Amounts,
    now: float,
    min_runtime_s: float,
) -> list[AdmissionDecision]:
    """Priority preemption in queues with no quota (the `default` queue).

    Such a queue admits everything at once, so quota never makes a high-priority job preempt:
    it sits Queued while lower-priority jobs of its queue hold the nodes. Here an admitted,
    unplaced job that does not fit the cluster's free capacity (summed over healthy nodes)
    preempts placed jobs of its own queue with strictly lower priority — lowest priority and
    newest first, only as many as make it fit, never one placed less than `min_runtime_s` ago,
    and only if its queue's `within_queue` is `lower_priority` and its class may preempt (when
    either says never and preempting would have made room, a `Stall` says so for its reason;
    one too when only the rate limit keeps it waiting).

    Jobs are not held back (they stay Queued, so placement policies still see every one of
    them), and with equal priorities there is never a victim, so nothing changes for them.
    Capacity is summed, not per node: a job that fits the sum but no single node waits without
    preempting (fragmentation is left to the placement policy)."""
    if capacity.get("cores") <= 0 and capacity.get("gpus") <= 0:
        return []
    placed = [j for j in jobs if j.stage in (Stage.ACTIVE, Stage.STOPPING) and j.id not in evicted]
    used = Amounts()
    for j in placed:
        used = used.plus(j.demand)
    free = capacity.minus(used)
    soon = Amounts()  # what jobs already being preempted give back when they stop
    for j in placed:
        if j.stage == Stage.STOPPING and j.preempted:
            soon = soon.plus(j.demand)
    waiting = sorted(
        (j for j in jobs if j.stage == Stage.QUEUED and j.queue in queues and _unlimited(queues[j.queue])),
        key=lambda j: (-j.priority, j.submitted_at, j.id),
    )
    out: list[AdmissionDecision] = []
    for w in waiting:
        if _fits(w.demand, free):
            free = free.minus(w.demand)  # the placement policy can place it: keep it for it
            continue
        if _fits(w.demand, free.plus(soon)):
            free, soon = free.plus(soon).minus(w.demand), Amounts()
            continue  # preempted jobs are still stopping: wait for them, take nobody else
        blocked = None
        if not w.may_preempt:
            blocked = "its priority class does not preempt (preemption: never)"
        elif queues[w.queue].within_queue == WithinQueue.NEVER:
            blocked = f"queue {w.queue} does not preempt for it (within_queue=never)"
        lower = [
            a
            for a in placed
            if a.stage == Stage.ACTIVE and a.queue == w.queue and a.priority < w.priority and a.id not in evicted
        ]
        young = [a for a in lower if a.running_since is not None and now - a.running_since < min_runtime_s]
        young_ids = {a.id for a in young}
        cands = sorted(
            (a for a in lower if a.id not in young_ids),
            key=lambda a: (a.priority, -(a.running_since or 0.0), a.id),
        )
        trial, chosen = free, []
        for a in cands:
            if _fits(w.demand, trial):
                break
            if any(a.demand.get(r) > 0 and w.demand.get(r) > 0 for r in SHARE_RESOURCES):
                trial = trial.plus(a.demand)
                chosen.append(a)
        if not chosen or not _fits(w.demand, trial):
            if blocked is None and young and _fits(w.demand, _sum_demand(young, trial)):
                # The rate limit alone keeps it waiting: say so, as reclaim does (docs/queues.md).
                out.append(
                    Stall(
                        w.id,
                        f"{len(young)} lower-priority job(s) of queue {w.queue} that would make room ran less "
                        f"than {fmt(min_runtime_s)}s (no thrashing): it preempts them once they have",
                    )
                )
            continue
        if blocked is not None:
            out.append(
                Stall(
                    w.id,
                    f"{blocked}: it waits for room rather than preempting {len(chosen)} lower-priority job(s) "
                    f"of queue {w.queue}",
                )
            )
            continue
        room = f"the cluster has no room for it ({_describe_free(free, w.demand)})"
        for a in chosen:
            evicted.add(a.id)
            detail = f"job {w.id} of queue {w.queue} has priority {w.priority} > {a.priority} and {room}"
            if a.tenant == w.tenant:
                why = f"preempted to place {w.id}: {detail}"
            else:  # same queue, so the victim's tenant knows its name; not the other tenant's job
                why = (
                    f"preempted to place a job of another tenant: it has priority {w.priority} > {a.priority} "
                    f"in queue {w.queue} and {room}"
                )
            out.append(Evict(a.id, why, w.id, f"preempted to place {w.id}: {detail}"))
        free = trial.minus(w.demand)
    return out


def _sum_demand(jobs: Iterable[AdmissionJob], start: Amounts) -> Amounts:
    total = start
    for a in jobs:
        total = total.plus(a.demand)
    return total


def _describe_free(free: Amounts, d: Amounts) -> str:
    return ", ".join(
        f"{r} {fmt(max(0.0, free.get(r)))} free, needs {fmt(d.get(r))}" for r in SHARE_RESOURCES if d.get(r) > 0
    )


def _share(u: Amounts, capacity: Amounts) -> float:
    return max((u.get(r) / capacity.get(r) for r in SHARE_RESOURCES if capacity.get(r) > 0), default=0.0)


def _reclaim(
    ledger: QuotaLedger,
    admitted: Iterable[AdmissionJob],
    evicted: set[str],
    job: AdmissionJob,
    short: list[str],
    now: float,
    min_runtime_s: float,
    grants: Grants | None = None,
) -> list[tuple[AdmissionJob, str, str]] | str:
    """The jobs to preempt so that `job` fits, each with the reason its tenant reads and the
    whole story for the operator's log, or the reason (appended to the wait) why none."""
    q = job.queue
    cohort = ledger.cohort_key(q)
    mates = [a for a in admitted if a.queue in ledger.queues and ledger.cohort_key(a.queue) == cohort]
    # Jobs already being preempted give their quota back soon: wait for them first.
    going = [a for a in mates if a.stage == Stage.STOPPING and a.preempted]
    if going:
        trial = ledger.copy()
        for a in going:
            trial.remove(a.queue, a.demand)
        if not trial.shortfall(q, job.demand)[0]:
            return f"; waiting for {len(going)} preempted job(s) to checkpoint and stop"
    in_quota = ledger.in_nominal(q, job.demand)
    cfg = ledger.queues[q]
    protected = refused = by_class = 0
    cands: list[AdmissionJob] = []
    for a in mates:
        if a.id in evicted or a.stage not in (Stage.QUEUED, Stage.ACTIVE):
            continue
        if not any(a.demand.get(r) > 0 for r in short):
            continue
        if a.queue == q:
            if a.priority >= job.priority:
                continue
            if not job.may_preempt:
                by_class += 1
                continue
            if cfg.within_queue == WithinQueue.NEVER:
                refused += 1
                continue
        else:
            if not ledger.borrowing(a.queue):
                continue
            if not in_quota:  # a borrower takes from borrowers only by priority
                if a.priority >= job.priority:
                    continue
                if not job.may_preempt:
                    by_class += 1
                    continue
            if cfg.reclaim_within_cohort == Reclaim.NEVER or (
                cfg.reclaim_within_cohort == Reclaim.LOWER_PRIORITY and a.priority >= job.priority
            ):
                refused += 1
                continue
        if a.stage == Stage.ACTIVE and a.running_since is not None and now - a.running_since < min_runtime_s:
            protected += 1
            continue
        cands.append(a)
    # Other queues' borrowers before the job's own queue's jobs, as Kueue orders candidates: a
    # job's own lower-priority job is preempted only where reclaiming from borrowers does not
    # make room (preempting it first left its queue under nominal while others still borrowed,
    # and the victim then reclaimed from them anyway: one needless stop).
    cands.sort(key=lambda a: (a.stage != Stage.QUEUED, a.queue == q, a.priority, -(a.running_since or 0.0), a.id))
    trial = ledger.copy()
    chosen: list[tuple[AdmissionJob, str, str]] = []
    for a in cands:
        if not trial.shortfall(q, job.demand)[0]:
            break
        if a.queue != q and not trial.borrowing(a.queue):
            continue  # reclaim only while its queue is above its nominal quota
        chosen.append((a, *_preempted_because(trial, job, a, in_quota, grants)))
        trial.remove(a.queue, a.demand)
    if chosen and not trial.shortfall(q, job.demand)[0]:
        # Kueue's second pass: a victim taken early that the job fits without is given back
        # (the last one taken is needed). Borrowers come first: where only the job's own queue's
        # job makes room (its queue may not borrow), every borrower taken before it was a
        # needless stop of another queue's job.
        for k in range(len(chosen) - 2, -1, -1):
            a = chosen[k][0]
            trial.add(a.queue, a.demand)
            if trial.shortfall(q, job.demand)[0]:
                trial.remove(a.queue, a.demand)
            else:
                del chosen[k]
        return chosen
    if protected:
        return f"; {protected} job(s) that could give quota back ran less than {fmt(min_runtime_s)}s (no thrashing)"
    held = []
    if by_class:
        held.append("its priority class does not preempt (preemption: never)")
    if refused:
        held.append(
            f"queue {q} does not preempt for it (reclaim_within_cohort={cfg.reclaim_within_cohort}, "
            f"within_queue={cfg.within_queue})"
        )
    if held:
        return f"; {' and '.join(held)}: it waits for {by_class + refused} job(s) that hold the quota to finish"
    return ""


def _preempted_because(
    ledger: QuotaLedger, job: AdmissionJob, victim: AdmissionJob, in_quota: bool, grants: Grants | None
) -> tuple[str, str]:
    """Why `victim` gives way to `job`: the reason written into the victim's record (read by
    the victim's tenant) and the whole story (for the operator's log). The reason names `job`
    only when it is the same tenant's, and `job`'s queue only when the victim's tenant is
    granted it (queue names do not leak, docs/queues.md); the victim's own queue and cohort
    it knows."""
    q, a = job.queue, victim
    if a.queue == q:
        detail = f"job {job.id} of queue {q} has priority {job.priority} > {a.priority} and needs the quota"
    elif in_quota:
        detail = f"queue {q} reclaims its nominal quota for job {job.id}; {ledger.describe(a.queue)}"
    else:
        detail = f"job {job.id} of queue {q} has priority {job.priority} > {a.priority}; {ledger.describe(a.queue)}"
    full = f"preempted to admit {job.id}: {detail}"
    if a.tenant == job.tenant:
        return full, full
    where = f"queue {q}" if granted(grants, a.tenant, q) else f"another queue of cohort {ledger.queues[q].cohort}"
    if a.queue == q:
        why = f"it has priority {job.priority} > {a.priority} in queue {q} and needs the quota"
    elif in_quota:
        why = f"{where} reclaims its nominal quota; {ledger.describe(a.queue)}"
    else:
        why = f"it is in {where} and has priority {job.priority} > {a.priority}; {ledger.describe(a.queue)}"
    return f"preempted to admit a job of another tenant: {why}", full


__all__ = [
    "AdmissionDecision",
    "AdmissionJob",
    "Admit",
    "Evict",
    "Grants",
    "Hold",
    "QuotaLedger",
    "Stage",
    "Stall",
    "TenantLimits",
    "admit",
    "capacity_preemption_possible",
    "granted",
]
