"""`sluice sim ...`: The simulator: run policies on traces and workloads."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sluice.cli.client import EXIT_USAGE, CliError
from sluice.cli.output import (
    Output,
    OutputOpt,
    bad_input,
    console,
    emit,
    err_console,
    errors_reported,
    in_range,
    table,
)
from sluice.sim.workload import MAX_DURATION_S

if TYPE_CHECKING:
    from sluice.control.simulate import FailurePlan, SimConfig, SimResult, WorkloadJob

app = typer.Typer(help="The simulator: run policies on traces and workloads.", no_args_is_help=True)


def _hours(s: float) -> str:
    return "-" if math.isnan(s) else f"{s / 3600:.3f} h"


MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 64
MAX_CPUS_PER_NODE = 1024.0
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 3600.0
MIN_LOAD_FACTOR = 0.01
MAX_LOAD_FACTOR = 1000.0
MAX_WINDOW_H = 100_000.0
MAX_JOBS = 1_000_000
MAX_FAIL_RATE = 1.0
MAX_REPAIR_S = 7 * 86_400.0
MAX_FAIL_AT_S = 1e9
MAX_SEED = 2**32 - 1
MAX_CPU_JOBS = 100_000
MAX_STAGGER_S = 86_400.0
MIN_PROFILE_S = 2.0
MAX_PROFILE_S = 3600.0
MAX_PROFILE_LIMITS = 16


def _fail_at(items: list[str], nodes: list[str]) -> list[tuple[float, str]]:
    """`SECONDS:NODE` items, each a time from 0 to MAX_FAIL_AT_S and a node of the cluster."""
    out = []
    for item in items:
        t, sep, node = item.partition(":")
        try:
            at = float(t)
        except ValueError:
            bad_input(f"--fail-at {item}", "expected SECONDS:NODE, e.g. 3600:n03")
        if not sep or not node:
            bad_input(f"--fail-at {item}", "expected SECONDS:NODE, e.g. 3600:n03")
        if not (math.isfinite(at) and 0 <= at <= MAX_FAIL_AT_S):
            bad_input(f"--fail-at {item}", f"SECONDS must be from 0 to 1e9, got {t}")
        if node not in nodes:
            bad_input(f"--fail-at {item}", f"no node {node!r}; the nodes are {nodes[0]} to {nodes[-1]}")
        out.append((at, node))
    return out


DEFAULT_REPAIR_S = 1800.0
"""Seconds until a lost node comes back unless --repair-s says otherwise (used only with failures)."""
DEFAULT_GPUS_PER_NODE = 4
"""GPUs per simulated node for GPU workloads when --gpus-per-node is not given (CPU workloads: 0)."""


def _cpu_spec(workload: str) -> tuple[int, float]:
    """`cpu:N[:STAGGER_S]` as (N, stagger), each in its range, or a usage error."""
    parts = workload.split(":")
    usage = "expected cpu:N[:STAGGER_S], e.g. cpu:20 or cpu:20:30"
    if len(parts) > 3:
        bad_input(f"--workload {workload}", usage)
    try:
        n = int(parts[1])
        stagger = float(parts[2]) if len(parts) > 2 else 30.0
    except ValueError:
        bad_input(f"--workload {workload}", usage)
    if not 1 <= n <= MAX_CPU_JOBS:
        bad_input(f"--workload {workload}", f"N must be from 1 to {MAX_CPU_JOBS}, got {n}")
    if not (math.isfinite(stagger) and 0 <= stagger <= MAX_STAGGER_S):
        bad_input(f"--workload {workload}", f"STAGGER_S must be from 0 to {MAX_STAGGER_S:g}, got {parts[2]}")
    return n, stagger


def _load_jobs(
    workload: str,
    *,
    load_factor: float,
    window_start_h: float | None,
    window_hours: float | None,
    max_jobs: int | None,
    seed: int,
) -> list[WorkloadJob]:
    """The workload's jobs: a trace file, or `cpu:N[:STAGGER_S]` for synthetic CPU jobs.
    Rows of a file that carry no GPU work (0 GPUs or 0 duration) are skipped with a note on stderr."""
    from sluice.control import simulate as sim

    notes: list[str] = []
    try:
        if workload.startswith("cpu:"):
            n, stagger = _cpu_spec(workload)
            trace_only = {
                "--max-jobs": max_jobs is not None,
                "--load-factor": load_factor != 1.0,
                "--window-start-h": window_start_h is not None,
                "--window-hours": window_hours is not None,
            }
            for flag, given in trace_only.items():
                if given:
                    bad_input(
                        flag,
                        f"applies to a trace CSV, not to the synthetic {workload} (its N jobs arrive STAGGER_S apart: "
                        "change N or STAGGER_S instead)",
                    )
            jobs = sim.cpu_workload(n, stagger_s=stagger, seed=seed)
        else:
            jobs = sim.load_workload(
                workload,
                load_factor=load_factor,
                window_start_h=window_start_h,
                window_hours=window_hours,
                max_jobs=max_jobs,
                seed=seed,
                notes=notes,
            )
    except sim.WorkloadError as err:
        bad_input("--workload", str(err))
    for note in notes:
        err_console.print(f"note: --workload: {note}", markup=False)
    if not jobs:
        bad_input(f"--workload {workload}", "no jobs in it (or in the chosen window)")
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


def _failures(fail_rate: float, fail_at: list[str], repair_s: float, seed: int, nodes: list[str]) -> FailurePlan | None:
    from sluice.control.simulate import FailurePlan

    losses = _fail_at(fail_at, nodes)
    if fail_rate <= 0 and not losses:
        if repair_s != DEFAULT_REPAIR_S:
            bad_input("--repair-s", "applies only with --fail-rate or --fail-at: no node is lost in this run")
        return None
    return FailurePlan(at=losses, rate_per_node_hour=fail_rate, repair_s=repair_s, seed=seed)


def _simulate(jobs: list[WorkloadJob], policy: str, cfg: SimConfig) -> SimResult:
    from sluice.control import simulate as sim

    mode = f" ({sim.mode_label(True)})" if cfg.oracle else ""
    try:
        with console.status(f"simulating {len(jobs)} jobs under {policy}{mode}…"):
            return sim.run_simulation(jobs, policy, cfg)
    except sim.WorkloadError as err:
        bad_input("--workload", str(err))
    except sim.SimDataMissing as err:
        raise CliError(str(err), EXIT_USAGE) from None
    except ValueError as err:
        if "unknown policy" in str(err):
            bad_input("--policy", str(err))
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
            f"FlowCon-style CPU workload (N from 1 to {MAX_CPU_JOBS:,}, STAGGER_S from 0 to {MAX_STAGGER_S:,.0f}, "
            "default 30). A row with a value out of range (negative GPUs or duration, a duration over "
            f"{MAX_DURATION_S:.0e} s) is refused with its row number; trace rows with 0 GPUs or 0 duration carry "
            "no GPU work and are skipped, with a note. A job needing more GPUs than the cluster has is refused.",
        ),
    ],
    policy: Annotated[
        str,
        typer.Option(
            help="Policy name (see `sluice sim policies`), variants included: pollux-prior, sluice-prior, sluice-gns."
        ),
    ] = "sluice",
    nodes: Annotated[int, typer.Option(help=f"Nodes in the simulated cluster (1 to {MAX_NODES:,}).")] = 16,
    gpus_per_node: Annotated[
        int | None,
        typer.Option(help=f"GPUs per node, 0 to {MAX_GPUS_PER_NODE} (default 4, or 0 for CPU workloads)."),
    ] = None,
    cpus_per_node: Annotated[
        float | None,
        typer.Option(
            help=f"Cores per node, 1 to {MAX_CPUS_PER_NODE:g} "
            "(default 8 for CPU workloads, else 4 per GPU, at least 8)."
        ),
    ] = None,
    interval: Annotated[
        float,
        typer.Option(help=f"Seconds between scheduling rounds ({MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g})."),
    ] = 60.0,
    load_factor: Annotated[
        float,
        typer.Option(
            help=f"Arrival-rate multiplier of a workload CSV, {MIN_LOAD_FACTOR:g} to {MAX_LOAD_FACTOR:g} "
            "(traces: <1 samples, >1 compresses); refused with cpu:N."
        ),
    ] = 1.0,
    window_start_h: Annotated[
        float | None,
        typer.Option(
            help=f"Trace window start, hours after its first job (0 to {MAX_WINDOW_H:,.0f}); refused with cpu:N."
        ),
    ] = None,
    window_hours: Annotated[
        float | None,
        typer.Option(help=f"Trace window length in hours (above 0, at most {MAX_WINDOW_H:,.0f}); refused with cpu:N."),
    ] = None,
    max_jobs: Annotated[
        int | None,
        typer.Option(help=f"Keep only the first N jobs of a workload CSV (1 to {MAX_JOBS:,}); refused with cpu:N."),
    ] = None,
    fail_rate: Annotated[float, typer.Option(help=f"Random node losses per node-hour (0 to {MAX_FAIL_RATE:g}).")] = 0.0,
    fail_at: Annotated[
        list[str] | None,
        typer.Option(
            help="Lose a node at a time: SECONDS:NODE (repeatable; SECONDS from 0 to 1e9, NODE one of the "
            "cluster's: n0..n9 for up to 10 nodes, n00..n15 for 16, n000.. for 100 or more)."
        ),
    ] = None,
    repair_s: Annotated[
        float,
        typer.Option(
            help=f"Seconds until a lost node comes back (0 to {MAX_REPAIR_S:,.0f}); only with --fail-rate or --fail-at."
        ),
    ] = DEFAULT_REPAIR_S,
    seed: Annotated[int, typer.Option(help=f"Seed for sampling and failures (0 to {MAX_SEED}).")] = 0,
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
    makespan, restarts and QoE targets met. Every flag, policy name, node name and workload row
    is checked before the run starts: bad input exits 2 with one `error:` line."""
    from sluice.control import simulate as sim

    with errors_reported():
        if out is not None and out.suffix.lower() not in (".csv", ".json"):
            bad_input(f"--out {out}", "must end in .csv or .json")
        if cdf is not None and cdf.suffix.lower() != ".png":
            bad_input(f"--cdf {cdf}", "must end in .png")
        for flag, path in (("--out", out), ("--cdf", cdf)):
            if path is not None and path.is_dir():
                bad_input(f"{flag} {path}", "is a folder; give a file")
            if path is not None and not path.parent.is_dir():
                bad_input(f"{flag} {path}", f"no folder {path.parent}")
        in_range("--nodes", nodes, 1, MAX_NODES)
        in_range("--gpus-per-node", gpus_per_node, 0, MAX_GPUS_PER_NODE)
        in_range("--cpus-per-node", cpus_per_node, 1, MAX_CPUS_PER_NODE)
        in_range("--interval", interval, MIN_INTERVAL_S, MAX_INTERVAL_S)
        in_range("--load-factor", load_factor, MIN_LOAD_FACTOR, MAX_LOAD_FACTOR)
        in_range("--window-start-h", window_start_h, 0, MAX_WINDOW_H)
        in_range("--window-hours", window_hours, 0, MAX_WINDOW_H, above=True)
        in_range("--max-jobs", max_jobs, 1, MAX_JOBS)
        in_range("--fail-rate", fail_rate, 0, MAX_FAIL_RATE)
        in_range("--repair-s", repair_s, 0, MAX_REPAIR_S)
        in_range("--seed", seed, 0, MAX_SEED)
        known = sim.policy_names()
        if policy not in known:
            bad_input("--policy", f"unknown policy {policy!r}; choose one of {', '.join(known)}")
        failures = _failures(fail_rate, fail_at or [], repair_s, seed, sim.node_names(nodes))
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
                failures=failures,
                oracle=oracle,
            )
        except ValueError as err:
            raise CliError(str(err), EXIT_USAGE) from None
        try:
            sim.preflight(jobs, cfg)
        except sim.WorkloadError as err:
            bad_input("--workload", str(err))
        except sim.SimDataMissing as err:
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
    cores: Annotated[
        str,
        typer.Option(
            help=f"CPU limits to measure at (comma-separated cores, each above 0 and at most {MAX_CPUS_PER_NODE:g}; "
            f"at most {MAX_PROFILE_LIMITS} of them)."
        ),
    ] = "0.5,1,2",
    seconds: Annotated[
        float, typer.Option(help=f"Seconds to run at each limit ({MIN_PROFILE_S:g} to {MAX_PROFILE_S:g}).")
    ] = 20.0,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Where to save the profile (JSON); default SPEC with .profile.json, e.g. examples/mlp.profile.json."
        ),
    ] = None,
) -> None:
    """Run a real example on the local engine at several CPU limits (real kernel quotas) and save
    its throughput and loss curves as a profile the simulator's CPU jobs can use: `sluice bench
    simreal --profiles DIR` reuses DIR/<example>.profile.json (docs/simulator.md, "Profiles")."""
    from sluice.control.profile import profile_example, save_profile
    from sluice.spec import SpecError

    with errors_reported():
        try:
            limits = tuple(float(c) for c in cores.split(",") if c.strip())
        except ValueError:
            bad_input(f"--cores {cores}", "give numbers, e.g. 0.5,1,2")
        if not limits or len(limits) > MAX_PROFILE_LIMITS:
            bad_input(f"--cores {cores}", f"give 1 to {MAX_PROFILE_LIMITS} limits, e.g. 0.5,1,2")
        if any(not (math.isfinite(c) and 0 < c <= MAX_CPUS_PER_NODE) for c in limits):
            bad_input(f"--cores {cores}", f"each limit must be above 0 and at most {MAX_CPUS_PER_NODE:g}")
        in_range("--seconds", seconds, MIN_PROFILE_S, MAX_PROFILE_S)
        if out is not None and out.is_dir():
            bad_input(f"--out {out}", "is a folder; give a file")
        if out is not None and not out.parent.is_dir():
            bad_input(f"--out {out}", f"no folder {out.parent}")
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
            f"{curve.loss_half_steps:.0f} steps; {started}; profile saved to {dest}"
        )
        console.print(_profile_use(dest, spec), markup=False)


def _profile_use(dest: Path, spec: Path) -> str:
    """How a saved profile is used: `bench simreal --profiles DIR` reads DIR/<example>.profile.json
    for the examples of its mixed workload. `sim run`'s CSV workloads and cpu:N name no profile
    (cpu:N runs the parametric families); see docs/simulator.md, "Profiles"."""
    wanted = f"{spec.stem}.profile.json"
    if spec.stem not in SIMREAL_EXAMPLES:
        return (
            f"`sluice bench simreal` reads profiles of {', '.join(SIMREAL_EXAMPLES)} only; use this one from Python "
            f"as WorkloadJob(kind='cpu', cpu_profile='{dest}') (docs/simulator.md, 'Profiles')"
        )
    where = (
        f"sluice bench simreal --profiles {dest.parent}"
        if dest.name == wanted
        else f"sluice bench simreal --profiles DIR, once saved there as {wanted}"
    )
    return f"use it with: {where} (it reads {wanted} for its mixed workload's {spec.stem} jobs)"


SIMREAL_EXAMPLES = ("mlp", "cnn", "lstm", "autoencoder")
"""The examples of `bench simreal`'s mixed workload (bench/scenario.py), the ones a saved profile serves."""


@app.command()
def policies() -> None:
    """The policies the simulator (and the controller) can run, their named variants included
    (pollux-prior, sluice-prior: the fixed speed-up prior; sluice-gns: gradient noise scale)."""
    from sluice.control.simulate import policy_names

    for name in policy_names():
        typer.echo(name)
