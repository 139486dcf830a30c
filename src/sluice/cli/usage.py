"""`sluice usage`: what each tenant's jobs held and ran, for chargeback (Slurm's `sreport`)."""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Annotated, Any

import typer

from sluice.cli.client import EXIT_USAGE, CliError, connect
from sluice.cli.output import Output, OutputOpt, emit, errors_reported, table, when

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_time(text: str, now: float | None = None) -> float:
    """--since as a Unix time: a duration back from now (`90m`, `24h`, `7d`) or an ISO 8601
    time with its timezone (`2026-11-01T00:00:00Z`); a usage error otherwise."""
    value = text.strip()
    m = _DURATION.fullmatch(value)
    if m:
        return (time.time() if now is None else now) - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise CliError(
            f"--since: {value[:60]!r} is neither a duration (90m, 24h, 7d) nor an ISO 8601 time with its "
            "timezone (2026-11-01T00:00:00Z)",
            EXIT_USAGE,
        )
    return at.timestamp()


def usage(
    since: Annotated[
        str | None,
        typer.Option(
            help="The window's start: a duration back (24h, 7d) or an ISO 8601 time with zone. Hours are those "
            "held from the hour it falls in on; jobs, phases and restarts those of the jobs submitted since."
        ),
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="One tenant's (admin).")] = None,
    all_tenants: Annotated[bool, typer.Option("--all", help="Every tenant's (admin).")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """What jobs held, used and ran, per tenant: jobs by phase, GPU-hours and guaranteed core-hours
    held (Starting or Running; cpu.min x replicas for jobs without GPUs), core-hours their
    processes used (measured), hours run, restarts; and what its jobs' run folders hold on disk
    now, ended jobs' included (not of the window: what a tenant's max_disk_mb is held against).
    Your own tenant's, or with --all / --tenant (an admin token) every tenant's or one."""
    with errors_reported():
        start = None if since is None else since_time(since)
        with connect(admin=all_tenants or tenant is not None) as client:
            rows = client.usage(since=start, tenant=tenant, all_tenants=all_tenants)

    def render(items: list[dict[str, Any]]) -> None:
        if start is not None:
            typer.echo(f"jobs submitted since {when(start)}")
        table(
            [
                "TENANT",
                "JOBS",
                "PHASES",
                "GPU-HOURS",
                "CORE-HOURS",
                "CPU USED (CORE-H)",
                "RUN HOURS",
                "RESTARTS",
                "DISK NOW (MIB)",
            ],
            [
                [
                    u["tenant"],
                    u["jobs"],
                    ", ".join(f"{p} {n}" for p, n in sorted(u["phases"].items())),
                    f"{u['gpu_hours']:.2f}",
                    f"{u['core_hours']:.2f}",
                    f"{u.get('cpu_used_hours', 0.0):.2f}",
                    f"{u['run_hours']:.2f}",
                    u["restarts"],
                    f"{u.get('disk_mb', 0.0):.1f}",
                ]
                for u in items
            ],
        )

    emit(rows, output, render)
