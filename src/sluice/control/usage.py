"""Accounting: what each tenant's jobs held and ran (`sluice tenant usage`, `GET /v1/usage`).

What is charged is what a job *held* — GPUs, or guaranteed cores (`cpu.min` x replicas) for a
job without GPUs — for as long as it was Starting or Running, as Slurm charges allocated
TRES rather than measured use. The store sums it in one grouped read (`Store.job_usage`), so a
report costs the same however many jobs a tenant has run."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.store.base import UsageRow


@dataclass
class TenantUsage:
    """One tenant's jobs submitted in the report's window, and what they held and ran."""

    tenant: str
    jobs: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    """Jobs by phase now (a live job is counted where it stands)."""
    gpu_hours: float = 0.0
    """GPU-hours held by its jobs with GPUs."""
    core_hours: float = 0.0
    """Guaranteed core-hours held by its jobs without GPUs."""
    run_hours: float = 0.0
    """Job-hours run (Starting or Running), summed over attempts: what max_runtime_s counts."""
    restarts: int = 0
    """Failed attempts that were retried."""


def by_tenant(rows: list[UsageRow]) -> list[TenantUsage]:
    """The store's groups folded into one record a tenant, by name."""
    out: dict[str, TenantUsage] = {}
    for r in rows:
        u = out.setdefault(r.tenant, TenantUsage(r.tenant))
        u.jobs += r.jobs
        u.phases[r.phase] = u.phases.get(r.phase, 0) + r.jobs
        if r.gpu:
            u.gpu_hours += r.service_s / 3600
        else:
            u.core_hours += r.service_s / 3600
        u.run_hours += r.run_s / 3600
        u.restarts += r.restarts
    return [out[name] for name in sorted(out)]
