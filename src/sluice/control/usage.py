"""Accounting: what each tenant's jobs held and ran (`sluice usage`, `GET /v1/usage`).

What is charged is what a job *held* — GPUs, or guaranteed cores (`cpu.min` x replicas) for a
job without GPUs — for as long as it was Starting or Running, as Slurm charges allocated
TRES rather than measured use. Held time is kept by tenant and hour (`Store.held_time`), so a
window charges the hours in it, whenever the jobs were submitted; the job counts are of the
jobs submitted in it (`Store.job_usage`). Both are one grouped read, so a report costs the
same however many jobs a tenant has run. Beside what was held, what was used: the CPU-seconds
the jobs' processes used, as the nodes' cgroup counters measure them (`cpu_used_hours`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.store.base import HeldTime, UsageRow


@dataclass
class TenantUsage:
    """One tenant's jobs submitted in the report's window, and what they held and ran."""

    tenant: str
    jobs: int = 0
    """Jobs submitted in the window."""
    phases: dict[str, int] = field(default_factory=dict)
    """Those jobs by phase now (a live job is counted where it stands)."""
    gpu_hours: float = 0.0
    """GPU-hours held in the window by its jobs with GPUs (whenever submitted)."""
    core_hours: float = 0.0
    """Guaranteed core-hours held in the window by its jobs without GPUs."""
    run_hours: float = 0.0
    """Job-hours run in the window (Starting or Running): what max_runtime_s counts."""
    cpu_used_hours: float = 0.0
    """Core-hours its jobs' processes used in the window (GPU jobs' too), as the nodes count
    them: what was used, beside what was held."""
    restarts: int = 0
    """Failed attempts that were retried, of the jobs submitted in the window."""
    disk_mb: float = 0.0
    """MiB its jobs' run folders hold now, whenever submitted: each live job's newest disk
    check and each ended job's last (its folder stays until deleted). What its `max_disk_mb`
    is held against; not of the window."""


def by_tenant(rows: list[UsageRow], held: list[HeldTime]) -> list[TenantUsage]:
    """The store's groups folded into one record a tenant, by name: job counts from `rows`
    (jobs submitted in the window), hours from `held` (held time in the window)."""
    out: dict[str, TenantUsage] = {}
    for r in rows:
        u = out.setdefault(r.tenant, TenantUsage(r.tenant))
        u.jobs += r.jobs
        u.phases[r.phase] = u.phases.get(r.phase, 0) + r.jobs
        u.restarts += r.restarts
    for h in held:
        u = out.setdefault(h.tenant, TenantUsage(h.tenant))
        if h.gpu:
            u.gpu_hours += h.service_s / 3600
        else:
            u.core_hours += h.service_s / 3600
        u.run_hours += h.run_s / 3600
        u.cpu_used_hours += h.cpu_used_s / 3600
    return [out[name] for name in sorted(out)]
