"""`sluice demo`: the embedded control plane running real training jobs, drawn live.

Submits the example jobs at staggered times to a control plane in this process (local
engine, default policy flowcon), shows a progress bar per job (step, loss, CPU limit the
policy set, CPU actually used), and ends with a table per job.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from sluice.cli.bench import IntervalOpt, ScaleOpt, StaggerOpt, policy_list, workload_flags
from sluice.cli.output import bad_input

if TYPE_CHECKING:  # the control plane is imported only when the demo runs: keeps `sluice --help` fast
    from sluice.bench.scenario import RunResult
    from sluice.control.plane import ControlPlane
    from sluice.model import JobRecord


def _cpu_text(plane: ControlPlane, job: JobRecord) -> tuple[str, str]:
    alloc = job.allocation
    if alloc is None or not job.phase.active:
        return "-", "-"
    limit = alloc.assignments[0].cpu_limit
    lim = "shares" if limit is None else f"{limit:.2f}"
    with plane.controller.lock:
        sig = plane.controller.progress(job.id)
        used = sig.usage_history[-1][1] if sig and sig.usage_history else None
    return lim, "-" if used is None else f"{used:.2f}"


def demo(
    policy: Annotated[
        str, typer.Option(help="Scheduling policy (flowcon, kube, ...: `sluice sim policies`).")
    ] = "flowcon",
    stagger: StaggerOpt = 10.0,
    scale: ScaleOpt = 1.0,
    interval: IntervalOpt = 10.0,
    home: Annotated[Path | None, typer.Option(help="State folder for the demo (default: a temporary one).")] = None,
) -> None:
    """Run six real PyTorch jobs on this machine and watch sluice share the CPU between them."""
    from sluice.bench.scenario import embedded_plane, mixed_workload, run_workload
    from sluice.model import Phase

    # Judged before the plane starts, as `bench local` judges them: `--stagger nan` ran a
    # plane that never submitted, `--scale inf` failed every job, a bad policy left a folder.
    names = policy_list("--policy", policy)
    if len(names) != 1:
        bad_input("--policy", f"the demo runs one policy, got {len(names)}: {', '.join(names)}")
    workload_flags(stagger, scale, interval)

    console = Console()
    arrivals = mixed_workload(stagger, scale)
    tmp = None if home is not None else tempfile.TemporaryDirectory(prefix="sluice-demo-")
    where = home if home is not None else Path(tmp.name)  # type: ignore[union-attr]
    console.print(
        f"[bold]sluice demo[/]: {len(arrivals)} jobs, {stagger:g}s apart, policy [cyan]{policy}[/], state in {where}"
    )
    progress = Progress(
        TextColumn("{task.fields[name]:<14}"),
        TextColumn("{task.fields[phase]:<9}"),
        BarColumn(bar_width=28),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:>7}"),
        TextColumn("cpu limit {task.fields[limit]:>6}"),
        TextColumn("used {task.fields[used]:>5}"),
        TimeElapsedColumn(),
        console=console,
    )
    tasks: dict[str, TaskID] = {}
    totals: dict[str, int] = {}  # the tracker goes when a job ends; keep its total for the bar

    def tick(plane: ControlPlane, jobs: list[JobRecord], now: float) -> None:
        for job in jobs:
            if job.id not in tasks:
                tasks[job.id] = progress.add_task(
                    "", total=None, name=job.spec.name, phase="", loss="-", limit="-", used="-"
                )
            with plane.controller.lock:
                sig = plane.controller.progress(job.id)
                total = sig.total_steps if sig and sig.total_steps else totals.get(job.id)
            if total:
                totals[job.id] = total
            limit, used = _cpu_text(plane, job)
            done = job.phase == Phase.SUCCEEDED
            progress.update(
                tasks[job.id],
                completed=(total or job.step) if done else job.step,
                total=total,
                phase=str(job.phase),
                loss="-" if job.loss is None else f"{job.loss:.4f}",
                limit=limit,
                used=used,
            )

    try:
        with embedded_plane(where / "plane", policy, policy_interval_s=interval) as plane, progress:
            result = run_workload(plane, arrivals, on_tick=tick)
    finally:
        if tmp is not None:
            tmp.cleanup()
    _summary(console, result)
    if not result.succeeded:
        raise typer.Exit(1)


def _summary(console: Console, r: RunResult) -> None:
    t = Table(title=f"sluice demo — policy {r.policy}")
    for col in ("job", "phase", "steps", "final loss", "restarts", "submit→running (s)", "JCT (s)"):
        t.add_column(col, justify="right" if col != "job" else "left")
    for j in r.jobs:
        t.add_row(
            j.name,
            j.phase,
            str(j.steps),
            "-" if j.loss is None else f"{j.loss:.4f}",
            str(j.restarts),
            "-" if j.submit_to_running_s is None else f"{j.submit_to_running_s:.2f}",
            "-" if j.jct_s is None else f"{j.jct_s:.1f}",
        )
    console.print(t)
    console.print(
        f"average JCT {r.avg_jct_s:.1f}s, makespan {r.makespan_s:.1f}s, "
        f"control plane CPU {r.control_cpu_percent:.2f}% of one core"
    )
