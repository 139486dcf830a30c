"""`sluice bench fairness`: queues, quotas and preemption on the Philly trace, in the simulator.

The virtual clusters of the Philly trace are the tenants. Each gets a queue whose nominal GPU
quota is its share of the window's GPU time (at least its largest job, so that it can run
every job it submitted alone), and a fair-share weight equal to that quota. Four setups run
the same jobs through the production controller, admission and the `binpack` placement
policy, side by side:

- **no quotas**: every job in the `default` queue, no quota (what sluice did before queues);
- **strict quotas**: one queue per tenant, no cohort (no borrowing), FIFO within a queue —
  Kueue's BestEffortFIFO: a smaller later job may pass a big one that does not fit;
- **borrowing + DRF**: the queues in one cohort lend each other unused quota; spare capacity
  goes by weighted dominant-resource fairness; `reclaim_within_cohort: never`, so a lender
  waits for borrowers to finish;
- **borrowing + DRF + preemption**: the same with `reclaim_within_cohort: any`: a job within
  its quota preempts borrowers (they checkpoint and resume), at most once per
  `preempt_min_runtime_s` per job.

What is measured (from the book's records after every round, as a metrics scraper of the
real plane would see them — no simulator truth):

- **GPU utilisation** during the window (GPU-seconds allocated in it / GPUs x its length; the
  makespan is no denominator here, one job of the window may run for days after it), and in
  the rounds where some job waits (is the cluster work-conserving under backlog?);
- **average JCT per tenant**, and each tenant's average JCT *alone on its own quota* (its jobs
  only, in a queue of its nominal quota on the same cluster): the issue's goal is that no
  tenant does worse sharing than alone;
- **Jain's index** of the tenants' *satisfaction*: in every round where a tenant has work,
  allocated GPUs / min(its demand, its quota), capped at 1 (using idle capacity above one's
  quota is not unfairness), time-averaged per tenant;
- **guarantee violations**: a job waits although it fits in its tenant's unused nominal quota
  (quota minus GPUs the tenant's running jobs hold) for longer than `grace_s` — counted per
  job, with the hours beyond grace.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sluice.control.controller import job_demand
from sluice.control.simulate import SimConfig, SimResult, WorkloadJob, load_workload, run_simulation
from sluice.model import JobRecord, Phase
from sluice.model.queue import Limits, QueueConfig, Reclaim

console = Console(highlight=False)

SETUPS = ("no-quotas", "strict", "borrow-drf", "borrow-drf-preempt")
LABELS = {
    "no-quotas": "no quotas",
    "strict": "strict quotas (no borrowing)",
    "borrow-drf": "borrowing + DRF",
    "borrow-drf-preempt": "borrowing + DRF + preemption",
}
COHORT = "philly"
POLICY = "binpack"
RUNNING = (Phase.STARTING, Phase.RUNNING)
WAITING = (Phase.PENDING, Phase.QUEUED)


def entitlements(jobs: list[WorkloadJob], gpus: int) -> dict[str, int]:
    """Each tenant's nominal GPU quota: its share of the jobs' GPU time, at least its largest
    job, the rest split by share (largest remainder), summing to `gpus` where it can."""
    work: dict[str, float] = defaultdict(float)
    biggest: dict[str, int] = defaultdict(int)
    for j in jobs:
        work[j.user] += j.gpus * float(j.duration_s or 0.0)
        biggest[j.user] = max(biggest[j.user], j.gpus)
    total = sum(work.values())
    if total <= 0:
        raise ValueError("the window has no GPU work")
    fixed: dict[str, int] = {}
    while True:  # tenants whose share is below their largest job get that job's size
        rest = gpus - sum(fixed.values())
        free = {t: w for t, w in work.items() if t not in fixed}
        share = sum(free.values())
        more = {t: biggest[t] for t, w in free.items() if share > 0 and rest * w / share < biggest[t]}
        if not more:
            break
        fixed.update(more)
    rest = max(0, gpus - sum(fixed.values()))
    share = sum(work[t] for t in work if t not in fixed)
    exact = {t: rest * work[t] / share for t in work if t not in fixed} if share > 0 else {}
    quota = {t: math.floor(x) for t, x in exact.items()}
    left = rest - sum(quota.values())
    for t in sorted(exact, key=lambda t: exact[t] - quota[t], reverse=True)[:left]:
        quota[t] += 1
    quota.update(fixed)
    return dict(sorted(quota.items()))


def queues_for(setup: str, quota: dict[str, int]) -> tuple[QueueConfig, ...]:
    if setup == "no-quotas":
        return ()
    cohort = None if setup == "strict" else COHORT
    reclaim = Reclaim.ANY if setup == "borrow-drf-preempt" else Reclaim.NEVER
    return tuple(
        QueueConfig(f"vc-{t}", cohort, Limits(gpus=q), weight=max(q, 1), reclaim_within_cohort=reclaim)
        for t, q in quota.items()
    )


def assign_queues(jobs: list[WorkloadJob], setup: str) -> list[WorkloadJob]:
    if setup == "no-quotas":
        return jobs
    return [replace(j, queue=f"vc-{j.user}") for j in jobs]


@dataclass
class FairnessMeter:
    """Accumulates the service each tenant gets, round by round, from the book's records."""

    quota: dict[str, int]
    gpus: int
    interval_s: float
    grace_s: float
    horizon_s: float
    """The window: utilisation counts the GPU-seconds allocated before this time."""
    alloc_s: float = 0.0
    """GPU-seconds allocated within the window (all tenants)."""
    backlog_alloc_s: float = 0.0
    backlog_rounds: int = 0
    sat_sum: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    sat_rounds: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    waiting_fit_since: dict[str, float] = field(default_factory=dict)
    violated: dict[str, float] = field(default_factory=dict)
    """job id -> seconds it waited beyond grace while fitting its tenant's unused quota."""
    violated_tenant: dict[str, str] = field(default_factory=dict)

    def observe(self, now: float, live: list[JobRecord]) -> None:
        alloc: dict[str, float] = defaultdict(float)
        demand: dict[str, float] = defaultdict(float)
        waiting: list[JobRecord] = []
        for j in live:
            need = job_demand(j.spec).gpus
            demand[j.tenant] += need
            if j.phase in RUNNING and j.allocation is not None:
                alloc[j.tenant] += j.allocation.total_gpus
            elif j.phase in WAITING:
                waiting.append(j)
        used = sum(alloc.values())
        if now < self.horizon_s:
            self.alloc_s += used * min(self.interval_s, self.horizon_s - now)
        if waiting:
            self.backlog_rounds += 1
            self.backlog_alloc_s += used * self.interval_s
        for t, d in demand.items():
            target = min(d, self.quota.get(t, 0))
            if target > 0:
                self.sat_sum[t] += min(1.0, alloc[t] / target)
                self.sat_rounds[t] += 1
        fitting = set()
        for j in waiting:
            if job_demand(j.spec).gpus <= self.quota.get(j.tenant, 0) - alloc[j.tenant] + 1e-9:
                fitting.add(j.id)
                since = self.waiting_fit_since.setdefault(j.id, now)
                over = now - since - self.grace_s
                if over > 0:
                    self.violated[j.id] = over
                    self.violated_tenant[j.id] = j.tenant
        for jid in list(self.waiting_fit_since):
            if jid not in fitting:
                del self.waiting_fit_since[jid]

    def satisfaction(self) -> dict[str, float]:
        return {t: self.sat_sum[t] / n for t, n in self.sat_rounds.items() if n}

    def jain(self) -> float:
        xs = list(self.satisfaction().values())
        if not xs:
            return math.nan
        return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def _jct_by_tenant(res: SimResult, users: dict[str, str]) -> dict[str, float]:
    per: dict[str, list[float]] = defaultdict(list)
    for j in res.jobs:
        if j.jct_s is not None:
            per[users[j.name]].append(j.jct_s)
    return {t: sum(v) / len(v) for t, v in per.items()}


def _one(
    args: tuple[str, str | None, list[WorkloadJob], dict[str, int], int, float, float, float, float],
) -> dict[str, Any]:
    """One simulation: a setup over all tenants, or (tenant given) one tenant alone on its quota."""
    setup, alone, jobs, quota, nodes, interval_s, grace_s, min_runtime_s, horizon_s = args
    gpus = nodes * 8
    if alone is not None:
        jobs = [j for j in jobs if j.user == alone]
        quota = {alone: quota[alone]}
    cfg = SimConfig(
        nodes=nodes,
        gpus_per_node=8,
        interval_s=interval_s,
        queues=queues_for(setup, quota),
        tenant_weights={t: float(max(q, 1)) for t, q in quota.items()},
        preempt_min_runtime_s=min_runtime_s,
    )
    meter = FairnessMeter(quota, gpus, interval_s, grace_s, horizon_s)
    t0 = time.perf_counter()
    res = run_simulation(assign_queues(jobs, setup), POLICY, cfg, observe=meter.observe)
    users = {j.name: j.user for j in jobs}
    makespan = res.makespan_s
    preempted = sum(j.restarts for j in res.jobs)
    return {
        "setup": setup,
        "alone": alone,
        "jobs": len(jobs),
        "finished": len(res.finished),
        "wall_s": time.perf_counter() - t0,
        "makespan_h": makespan / 3600,
        "utilisation": meter.alloc_s / (gpus * horizon_s),
        "utilisation_backlog": (
            meter.backlog_alloc_s / (gpus * meter.backlog_rounds * interval_s) if meter.backlog_rounds else math.nan
        ),
        "avg_jct_h": res.avg_jct_s / 3600,
        "jct_h_by_tenant": {t: v / 3600 for t, v in _jct_by_tenant(res, users).items()},
        "satisfaction": meter.satisfaction(),
        "jain": meter.jain(),
        "violations": len(meter.violated),
        "violation_h": sum(meter.violated.values()) / 3600,
        "violations_by_tenant": dict(sorted(Counter(meter.violated_tenant.values()).items())),
        "restarts": preempted,
    }


def philly_window(trace: Path, start_day: float, hours: float, max_jobs: int | None) -> list[WorkloadJob]:
    return load_workload(trace, window_start_h=24 * start_day, window_hours=hours, max_jobs=max_jobs)


def run(
    *,
    trace: Path,
    start_day: float = 40.0,
    hours: float = 48.0,
    nodes: int = 32,
    interval_s: float = 60.0,
    grace_s: float = 300.0,
    preempt_min_runtime_s: float = 600.0,
    max_jobs: int | None = None,
    workers: int | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    jobs = philly_window(trace, start_day, hours, max_jobs)
    if not jobs:
        raise ValueError(f"no jobs in the window (day {start_day:g}, {hours:g} h) of {trace}")
    gpus = nodes * 8
    quota = entitlements(jobs, gpus)
    load = sum(j.gpus * float(j.duration_s or 0.0) for j in jobs) / (gpus * hours * 3600)
    console.print(
        f"fairness: {len(jobs)} Philly jobs (day {start_day:g}, {hours:g} h window; {len(quota)} virtual clusters "
        f"as tenants) on {nodes} nodes x 8 GPUs = {gpus} GPUs; offered load {load:.2f}x the window; "
        f"policy {POLICY}, {interval_s:g} s rounds; nominal quotas sum to {sum(quota.values())} GPUs"
    )
    console.print("quotas (GPUs): " + ", ".join(f"{t} {q}" for t, q in quota.items()))
    alone_of: list[str | None] = [None] * len(SETUPS) + list(quota)
    setups = [*SETUPS, *["strict"] * len(quota)]
    tasks = [
        (s, a, jobs, quota, nodes, interval_s, grace_s, preempt_min_runtime_s, hours * 3600.0)
        for s, a in zip(setups, alone_of, strict=True)
    ]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(_one, tasks))
    by_setup = {r["setup"]: r for r in results if r["alone"] is None}
    alone = {r["alone"]: r["jct_h_by_tenant"].get(r["alone"], math.nan) for r in results if r["alone"] is not None}
    console.print(f"{len(tasks)} simulations in {time.perf_counter() - t0:.0f} s")
    njobs: dict[str, int] = defaultdict(int)
    for j in jobs:
        njobs[j.user] += 1
    _print(by_setup, alone, quota, njobs, interval_s)
    summary = {
        "trace": str(trace),
        "start_day": start_day,
        "hours": hours,
        "nodes": nodes,
        "gpus": gpus,
        "interval_s": interval_s,
        "grace_s": grace_s,
        "preempt_min_runtime_s": preempt_min_runtime_s,
        "offered_load": load,
        "quota": quota,
        "setups": by_setup,
        "alone_jct_h": alone,
    }
    if out is not None:
        out.write_text(json.dumps(summary, indent=2, default=float))
    return summary


def _f(x: float, fmt: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _print(
    by_setup: dict[str, dict[str, Any]],
    alone: dict[str, float],
    quota: dict[str, int],
    njobs: dict[str, int],
    interval_s: float,
) -> None:
    base = by_setup["no-quotas"]
    t = Table(title="Fairness on the Philly trace (ratios to 'no quotas' in brackets)")
    for c in (
        "setup",
        "utilisation in window",
        "util. while jobs wait",
        "avg JCT h",
        "Jain (satisfaction)",
        "violations > grace",
        "violation h",
        "restarts (preemptions)",
        "worst tenant JCT / alone",
    ):
        t.add_column(c, justify="left" if c == "setup" else "right")
    for s in SETUPS:
        r = by_setup[s]
        worst = max(
            (r["jct_h_by_tenant"][k] / alone[k] for k in r["jct_h_by_tenant"] if alone.get(k, 0) > 0),
            default=math.nan,
        )
        t.add_row(
            LABELS[s],
            f"{_f(r['utilisation'], '.1%')} ({_f(r['utilisation'] / base['utilisation'])}x)",
            _f(r["utilisation_backlog"], ".1%"),
            f"{_f(r['avg_jct_h'])} ({_f(r['avg_jct_h'] / base['avg_jct_h'])}x)",
            _f(r["jain"], ".3f"),
            str(r["violations"]),
            _f(r["violation_h"], ".1f"),
            str(r["restarts"]),
            _f(worst),
        )
    console.print(t)
    p = Table(title="Average JCT per tenant (hours): each setup, and alone on its own quota")
    for c in ("tenant", "quota GPUs", "jobs", *[LABELS[s] for s in SETUPS], "alone on quota"):
        p.add_column(c, justify="left" if c == "tenant" else "right")
    for tnt in quota:
        row = [tnt, str(quota[tnt]), str(njobs.get(tnt, 0))]
        row += [_f(by_setup[s]["jct_h_by_tenant"].get(tnt, math.nan)) for s in SETUPS]
        row.append(_f(alone.get(tnt, math.nan)))
        p.add_row(*row)
    console.print(p)
    goals = by_setup["borrow-drf-preempt"]
    slack_h = interval_s / 3600  # the simulator's time resolution: one scheduling round
    worse = [
        f"{k} ({v:.2f} h vs {alone[k]:.2f} h)"
        for k, v in goals["jct_h_by_tenant"].items()
        if alone.get(k, 0) > 0 and v > alone[k] + slack_h
    ]
    lines = [
        ("zero guarantee violations", goals["violations"] == 0, f"{goals['violations']}"),
        (
            "utilisation within 5 % of no quotas",
            goals["utilisation"] >= 0.95 * base["utilisation"],
            f"{goals['utilisation']:.1%} vs {base['utilisation']:.1%}",
        ),
        ("Jain's index >= 0.95", goals["jain"] >= 0.95, f"{goals['jain']:.3f}"),
        (
            "no tenant's avg JCT worse than alone on its quota (by more than one round)",
            not worse,
            ", ".join(worse) or "none worse",
        ),
    ]
    console.print("goals for borrowing + DRF + preemption:")
    for name, ok, val in lines:
        console.print(f"  {'met    ' if ok else 'NOT met'}  {name}: {val}")
