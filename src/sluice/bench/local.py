"""`sluice bench local`: the mixed workload under `kube` and under `flowcon`, side by side.

Both runs use the same arrivals on the same machine, one after the other, each on a fresh
embedded control plane. Prints average JCT, makespan and their ratios, plus the control
plane's own CPU use and the submit-to-running latency.
"""

from __future__ import annotations

import json
import platform
import tempfile
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from sluice.bench.scenario import RunResult, embedded_plane, mixed_workload, run_workload


def run(
    policies: list[str],
    stagger_s: float = 10.0,
    scale: float = 1.0,
    policy_interval_s: float = 10.0,
    out: Path | None = None,
    console: Console | None = None,
) -> list[RunResult]:
    console = console or Console()
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
        for policy in policies:
            console.print(f"[bold]running the mixed workload under {policy}[/] ...")
            with embedded_plane(Path(tmp) / policy, policy, policy_interval_s=policy_interval_s) as plane:
                res = run_workload(plane, mixed_workload(stagger_s, scale))
            results.append(res)
            console.print(
                f"  {policy}: avg JCT {res.avg_jct_s:.1f}s, makespan {res.makespan_s:.1f}s, "
                f"all succeeded: {res.succeeded}"
            )
    print_report(results, console)
    if out is not None:
        out.write_text(json.dumps([as_dict(r) for r in results], indent=2))
    return results


def as_dict(r: RunResult) -> dict[str, object]:
    """A run as JSON-ready data (what --out writes; `bench simreal` reads it back)."""
    return {
        "policy": r.policy,
        "avg_jct_s": r.avg_jct_s,
        "makespan_s": r.makespan_s,
        "control_cpu_percent": r.control_cpu_percent,
        "busy_cpu_percent": r.busy_cpu_percent,
        "mean_submit_to_running_s": r.mean_submit_to_running_s,
        "jobs": [
            {
                "name": j.name,
                "phase": j.phase,
                "jct_s": j.jct_s,
                "submit_to_running_s": j.submit_to_running_s,
                "restarts": j.restarts,
                "steps": j.steps,
                "loss": j.loss,
            }
            for j in r.jobs
        ],
    }


def print_report(results: list[RunResult], console: Console) -> None:
    console.print(
        f"machine: {platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}"
    )
    per_job = Table(title="JCT per job (s)")
    per_job.add_column("job")
    for r in results:
        per_job.add_column(r.policy, justify="right")
    names = [j.name for j in results[0].jobs]
    for i, name in enumerate(names):
        cells = []
        for r in results:
            j = r.jobs[i] if i < len(r.jobs) else None
            cells.append("-" if j is None or j.jct_s is None else f"{j.jct_s:.1f}")
        per_job.add_row(name, *cells)
    console.print(per_job)
    base = results[0]
    summary = Table(title=f"mixed workload: {len(base.jobs)} jobs (ratios vs {base.policy})")
    for col in (
        "policy",
        "avg JCT (s)",
        "ratio",
        "makespan (s)",
        "ratio",
        "all succeeded",
        "control CPU % (run)",
        "control CPU % (≥6 running)",
        "submit→running mean/max (s)",
    ):
        summary.add_column(col, justify="right")
    for r in results:
        busy = r.busy_cpu_percent
        summary.add_row(
            r.policy,
            f"{r.avg_jct_s:.1f}",
            f"{r.avg_jct_s / base.avg_jct_s:.3f}",
            f"{r.makespan_s:.1f}",
            f"{r.makespan_s / base.makespan_s:.3f}",
            str(r.succeeded),
            f"{r.control_cpu_percent:.2f}",
            "-" if busy is None else f"{busy:.2f}",
            f"{r.mean_submit_to_running_s:.2f} / {r.max_submit_to_running_s:.2f}",
        )
    console.print(summary)
