"""`sluice sim ...`: The simulator: run policies on traces and workloads."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sluice.cli.client import EXIT_USAGE, CliError
from sluice.cli.output import Output, OutputOpt, console, emit, errors_reported, table

if TYPE_CHECKING:
    from sluice.control.simulate import FailurePlan, SimConfig, SimResult, WorkloadJob

app = typer.Typer(help="The simulator: run policies on traces and workloads.", no_args_is_help=True)


def _hours(s: float) -> str:
    return "-" if math.isnan(s) else f"{s / 3600:.3f} h"


def _fail_at(items: list[str]) -> list[tuple[float, str]]:
    out = []
    for item in items:
        t, sep, node = item.partition(":")
        try:
            out.append((float(t), node))
        except ValueError:
            raise CliError(f"--fail-at {item!r}: expected SECONDS:NODE, e.g. 3600:n03", EXIT_USAGE) from None
        if not sep or not node:
            raise CliError(f"--fail-at {item!r}: expected SECONDS:NODE, e.g. 3600:n03", EXIT_USAGE)
    return out


DEFAULT_GPUS_PER_NODE = 4
"""GPUs per simulated node for GPU workloads when --gpus-per-node is not given (CPU workloads: 0)."""


def _load_jobs(
    workload: str,
    *,
    load_factor: float,
    window_start_h: float | None,
    window_hours: float | None,
    max_jobs: int | None,
    seed: int,
) -> list[WorkloadJob]:
    """The workload's jobs: a trace file, or `cpu:N[:STAGGER_S]` for synthetic CPU jobs."""
    from sluice.control import simulate as sim

    try:
        if workload.startswith("cpu:"):
            parts = workload.split(":")
            if len(parts) > 3:
                raise ValueError
            n = int(parts[1])
            stagger = float(parts[2]) if len(parts) > 2 else 30.0
            if n < 1 or stagger < 0:
                raise ValueError
            jobs = sim.cpu_workload(n, stagger_s=stagger, seed=seed)
        else:
            jobs = sim.load_workload(
                workload,
                load_factor=load_factor,
                window_start_h=window_start_h,
                window_hours=window_hours,
                max_jobs=max_jobs,
                seed=seed,
            )
    except sim.WorkloadError as err:
        raise CliError(f"--workload: {err}", EXIT_USAGE) from None
    except ValueError:
        raise CliError(f"--workload {workload!r}: expected a file or cpu:N[:STAGGER_S]", EXIT_USAGE) from None
    if not jobs:
        raise CliError(f"--workload {workload}: no jobs in it (or in the chosen window)", EXIT_USAGE)
    return jobs


def _gpus_per_node(jobs: list[WorkloadJob], asked: int | None) -> int:
    """GPUs per node: as asked, else 0 when no job uses GPUs (a CPU workload) and 4 otherwise.
    A workload with GPU jobs on GPU-less nodes could never finish: refused."""
    uses_gpus = any(j.kind != "cpu" for j in jobs)
    if asked is None:
        return DEFAULT_GPUS_PER_NODE if uses_gpus else 0
    if asked == 0 and uses_gpus:
        raise CliError("--gpus-per-node 0: the workload has GPU jobs, which could never run", EXIT_USAGE)
    return asked


def _failures(fail_rate: float, fail_at: list[str], repair_s: float, seed: int) -> FailurePlan | None:
    from sluice.control.simulate import FailurePlan

    if fail_rate <= 0 and not fail_at:
        return None
    return FailurePlan(at=_fail_at(fail_at), rate_per_node_hour=fail_rate, repair_s=repair_s, seed=seed)


def _simulate(jobs: list[WorkloadJob], policy: str, cfg: SimConfig) -> SimResult:
    from sluice.control import simulate as sim

    mode = f" ({sim.mode_label(True)})" if cfg.oracle else ""
    try:
        with console.status(f"simulating {len(jobs)} jobs under {policy}{mode}…"):
            return sim.run_simulation(jobs, policy, cfg)
    except sim.WorkloadError as err:
        raise CliError(f"--workload: {err}", EXIT_USAGE) from None
    except sim.SimDataMissing as err:
        raise CliError(str(err), EXIT_USAGE) from None
    except ValueError as err:
        if "unknown policy" in str(err):
            raise CliError(f"--policy: {err}", EXIT_USAGE) from None
        raise


def _render(res: SimResult, interval: float, files: dict[str, Path | None]) -> None:
    met, total = res.qoe
    table(
        ["policy", "jobs", "avg JCT", "p99 JCT", "makespan", "restarts (/job-h)", "QoE met", "round (mean/max)"],
        [
            [
                res.label,
                f"{len(res.finished)}/{len(res.jobs)}",
                _hours(res.avg_jct_s),
                _hours(res.p99_jct_s),
                _hours(res.makespan_s),
                f"{res.restarts} ({res.restarts_per_job_hour:.2f})",
                f"{met}/{total}" if total else "n/a",
                f"{res.mean_round_s * 1000:.1f}/{res.max_round_s * 1000:.0f} ms",
            ]
        ],
    )
    if res.oracle:
        console.print(
            f"{res.mode.upper()}: policies saw the simulator's ground truth (exact remaining work and speedups); "
            "no real engine can, so these numbers bound what the policy could reach."
        )
    console.print(f"{res.rounds} rounds of {interval:g}s simulated in {res.wall_s:.1f}s wall time")
    for what, path in files.items():
        if path is not None:
            console.print(f"{what}: {path}")


@app.command()
def run(
    workload: Annotated[
        str,
        typer.Option(
            help="Workload CSV (Pollux, Philly or Helios/Acme columns), or cpu:N[:STAGGER_S] for a synthetic "
            "FlowCon-style CPU workload."
        ),
    ],
    policy: Annotated[str, typer.Option(help="Policy name (see `sluice sim policies`).")] = "sluice",
    nodes: Annotated[int, typer.Option(min=1, help="Nodes in the simulated cluster.")] = 16,
    gpus_per_node: Annotated[
        int | None, typer.Option(min=0, help="GPUs per node (default 4, or 0 for CPU workloads).")
    ] = None,
    cpus_per_node: Annotated[float | None, typer.Option(help="Cores per node (default 8 for CPU workloads).")] = None,
    interval: Annotated[float, typer.Option(help="Seconds between scheduling rounds.")] = 60.0,
    load_factor: Annotated[
        float, typer.Option(help="Arrival-rate multiplier (traces: <1 samples, >1 compresses).")
    ] = 1.0,
    window_start_h: Annotated[float | None, typer.Option(help="Trace window start, hours after its first job.")] = None,
    window_hours: Annotated[float | None, typer.Option(help="Trace window length in hours.")] = None,
    max_jobs: Annotated[int | None, typer.Option(min=1, help="Keep only the first N jobs.")] = None,
    fail_rate: Annotated[float, typer.Option(min=0, help="Random node losses per node-hour.")] = 0.0,
    fail_at: Annotated[list[str] | None, typer.Option(help="Lose a node at a time: SECONDS:NODE (repeatable).")] = None,
    repair_s: Annotated[float, typer.Option(min=0, help="Seconds until a lost node comes back.")] = 1800.0,
    seed: Annotated[int, typer.Option(help="Seed for sampling and failures.")] = 0,
    oracle: Annotated[
        bool,
        typer.Option(
            "--oracle",
            help="Give the policy the simulator's ground truth (exact remaining work and speedups): an upper-bound "
            "study, labelled 'oracle (upper bound)' in the table and files. Off: only what a real engine sees.",
        ),
    ] = False,
    out: Annotated[Path | None, typer.Option(help="Write per-job results here (.csv or .json).")] = None,
    cdf: Annotated[Path | None, typer.Option(help="Write a JCT CDF plot here (.png).")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Run one policy over a workload on the simulated cluster; print average and p99 JCT,
    makespan, restarts and QoE targets met."""
    from sluice.control import simulate as sim

    with errors_reported():
        if out is not None and out.suffix.lower() not in (".csv", ".json"):
            raise CliError(f"--out {out}: must end in .csv or .json", EXIT_USAGE)
        if cdf is not None and cdf.suffix.lower() != ".png":
            raise CliError(f"--cdf {cdf}: must end in .png", EXIT_USAGE)
        if interval <= 0:
            raise CliError(f"--interval: must be positive, got {interval}", EXIT_USAGE)
        if load_factor <= 0:
            raise CliError(f"--load-factor: must be positive, got {load_factor}", EXIT_USAGE)
        if cpus_per_node is not None and cpus_per_node <= 0:
            raise CliError(f"--cpus-per-node: must be positive, got {cpus_per_node}", EXIT_USAGE)
        jobs = _load_jobs(
            workload,
            load_factor=load_factor,
            window_start_h=window_start_h,
            window_hours=window_hours,
            max_jobs=max_jobs,
            seed=seed,
        )
        try:
            cfg = sim.SimConfig(
                nodes=nodes,
                gpus_per_node=_gpus_per_node(jobs, gpus_per_node),
                cpus_per_node=cpus_per_node,
                interval_s=interval,
                failures=_failures(fail_rate, fail_at or [], repair_s, seed),
                oracle=oracle,
            )
        except ValueError as err:
            raise CliError(str(err), EXIT_USAGE) from None
        res = _simulate(jobs, policy, cfg)
        if out is not None:
            sim.write_rows(res.rows(), out)
        if cdf is not None:
            sim.plot_jct_cdf({res.label: [j.jct_s for j in res.finished if j.jct_s is not None]}, cdf)
        emit(res.summary(), output, lambda _s: _render(res, interval, {"per-job results": out, "JCT CDF": cdf}))


@app.command()
def profile(
    spec: Annotated[Path, typer.Argument(help="Example job spec (YAML), e.g. examples/mlp.yaml.", dir_okay=False)],
    cores: Annotated[str, typer.Option(help="CPU limits to measure at (comma-separated cores).")] = "0.5,1,2",
    seconds: Annotated[float, typer.Option(min=2, help="Seconds to run at each limit.")] = 20.0,
    out: Annotated[Path | None, typer.Option(help="Where to save the profile (JSON).")] = None,
) -> None:
    """Run a real example on the local engine at several CPU limits (real kernel quotas) and save
    its throughput and loss curves as a profile the simulator's CPU jobs can use."""
    from sluice.control.profile import profile_example, save_profile
    from sluice.spec import SpecError

    with errors_reported():
        try:
            limits = tuple(float(c) for c in cores.split(",") if c.strip())
        except ValueError:
            raise CliError(f"--cores {cores!r}: give numbers, e.g. 0.5,1,2", EXIT_USAGE) from None
        if not limits or any(c <= 0 for c in limits):
            raise CliError(f"--cores {cores!r}: give positive numbers, e.g. 0.5,1,2", EXIT_USAGE)
        if not spec.is_file():
            raise CliError(f"SPEC {spec}: no such file", EXIT_USAGE)
        try:
            with console.status(f"profiling {spec.name} at {', '.join(f'{c:g}' for c in limits)} cores…"):
                curve, runs = profile_example(spec, limits, seconds)
        except SpecError as err:
            raise CliError(f"invalid job spec {spec}", EXIT_USAGE, [p.__dict__ for p in err.problems]) from None
        except RuntimeError as err:
            raise CliError(str(err)) from None
        dest = out or spec.with_suffix(".profile.json")
        save_profile(curve, runs, dest, str(spec), seconds)
        table(
            ["limit (cores)", "steps/s", "reports", "cores used", "threads", "start-up (s)"],
            [
                [
                    f"{r.cores:g}",
                    f"{r.steps_per_s:.1f}",
                    len(r.points),
                    "-" if r.cores_used is None else f"{r.cores_used:.2f}",
                    "-" if r.threads is None else str(r.threads),
                    "-" if r.startup_s is None else f"{r.startup_s:.1f}",
                ]
                for r in runs
            ],
        )
        started = (
            "start-up not measured"
            if curve.startup_cpu_s is None
            else f"start-up {curve.startup_cpu_s:.1f} CPU-s + {curve.startup_wait_s:.1f} s fixed"
        )
        console.print(
            f"loss {curve.loss_start:.3f} -> floor {curve.loss_floor:.3f}, half way after "
            f"{curve.loss_half_steps:.0f} steps; {started}; profile saved to {dest} "
            f"(use it in a workload as cpu_profile={dest})"
        )


@app.command()
def policies() -> None:
    """The policies the simulator (and the controller) can run."""
    from sluice.control.simulate import policy_names

    for name in policy_names():
        typer.echo(name)
