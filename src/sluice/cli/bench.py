"""`sluice bench ...`: Benchmarks that run contenders side by side and print ratios."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from sluice.cli.output import bad_input, in_range
from sluice.cli.sim import MAX_CPUS_PER_NODE, MAX_PROFILE_S, MAX_SEED, MIN_PROFILE_S

app = typer.Typer(help="Benchmarks that run contenders side by side and print ratios.", no_args_is_help=True)

MAX_STAGGER_S = 3600.0
"""Seconds between the mixed workload's six arrivals: at most an hour (0: all at once)."""
SCALES = (0.01, 10.0)
"""Scale of each example's length: 1 % (a few steps) to ten times the full length (tens of minutes a job)."""
INTERVALS_S = (0.5, 3600.0)
"""A policy's control interval on a real plane: no shorter than its reconcile round (0.5 s), at most an hour."""
StaggerOpt = Annotated[float, typer.Option(help=f"Seconds between job arrivals (0 to {MAX_STAGGER_S:g}).")]
ScaleOpt = Annotated[
    float,
    typer.Option(
        help=f"Scale of each example's length ({SCALES[0]:g} to {SCALES[1]:g}; 1 = full, 1-3 min on one core)."
    ),
]
IntervalOpt = Annotated[
    float, typer.Option(help=f"FlowCon's control interval Δ in seconds ({INTERVALS_S[0]:g} to {INTERVALS_S[1]:g}).")
]
"""The mixed workload's flags, as `bench local`, `bench ray` and `sluice demo` take them (checked by
`workload_flags`)."""
MIN_CORES = 0.01
"""The smallest CPU limit a cgroup takes: 1 ms of quota per 100 ms period."""
MAX_MEASURE_S = 3600.0
"""Longest measuring phase of a bench: an hour."""

SIM_MAX_WORKERS = 256
SIM_MAX_SCALE_JOBS = 1_000_000
SIM_MAX_SCALE_NODES = 100_000
SIM_LOAD_FACTORS = (0.01, 1000.0)
SIM_MAX_SCALE_HOURS = 100_000.0


def policy_list(flag: str, given: str) -> list[str]:
    """A comma-separated list of policies a plane runs (`sluice sim policies`), checked before any run."""
    from sluice.control.simulate import policy_names

    return _names(flag, given, policy_names()) or []


def _out(flag: str, path: Path | None) -> None:
    """A file the bench writes when it ends: its folder must exist now, not after the run."""
    if path is None:
        return
    if path.is_dir():
        bad_input(flag, f"{path} is a folder; give a file")
    if not path.parent.is_dir():
        bad_input(flag, f"{path}: no folder {path.parent}")


@app.command("local")
def local(
    policies: Annotated[
        str, typer.Option(help="Comma-separated policies (`sluice sim policies` names); the first is the baseline.")
    ] = "kube,flowcon",
    stagger: StaggerOpt = 10.0,
    scale: ScaleOpt = 1.0,
    interval: IntervalOpt = 10.0,
    out: Annotated[Path | None, typer.Option(help="Also write results as JSON here.")] = None,
) -> None:
    """The mixed example workload on the local engine under each policy, one after the other.
    Every flag and policy name is checked before the first run: bad input exits 2."""
    from sluice.bench import local as bench_local

    names = policy_list("--policies", policies)
    workload_flags(stagger, scale, interval)
    _out("--out", out)
    bench_local.run(names, stagger_s=stagger, scale=scale, policy_interval_s=interval, out=out)


def workload_flags(stagger: float, scale: float, interval: float) -> None:
    """The mixed workload's flags, shared by `bench local`, `simreal` and `ray`."""
    in_range("--stagger", stagger, 0, MAX_STAGGER_S)
    in_range("--scale", scale, *SCALES)
    in_range("--interval", interval, *INTERVALS_S)


@app.command("simreal")
def simreal(
    policies: Annotated[str, typer.Option(help="Comma-separated policies, each run for real and simulated.")] = (
        "kube,sluice"
    ),
    stagger: StaggerOpt = 5.0,
    scale: Annotated[
        float,
        typer.Option(
            help=f"Scale of each example's length ({SCALES[0]:g} to {SCALES[1]:g}; 0.3: about a minute a job)."
        ),
    ] = 0.3,
    interval: Annotated[
        float,
        typer.Option(
            help=f"The policy's control interval in seconds (FlowCon's Δ; {INTERVALS_S[0]:g} to {INTERVALS_S[1]:g})."
        ),
    ] = 10.0,
    profiles: Annotated[
        Path | None,
        typer.Option(
            help="Folder of profiles (<example>.profile.json): those present are reused, the rest measured "
            "and saved there (made if missing). Default: measure afresh now and keep nothing."
        ),
    ] = None,
    profile_seconds: Annotated[
        float,
        typer.Option(help=f"Seconds per CPU limit when profiling ({MIN_PROFILE_S:g} to {MAX_PROFILE_S:g})."),
    ] = 10.0,
    reprofile: Annotated[bool, typer.Option("--reprofile", help="Measure the profiles again even if saved.")] = False,
    real_from: Annotated[
        Path | None,
        typer.Option(
            help="Reuse the real runs of an earlier --out file (policies found there are not re-run); "
            "read and checked before anything runs."
        ),
    ] = None,
    mean_background: Annotated[
        bool,
        typer.Option(
            "--mean-background",
            help="Simulate the machine's other load as its mean over the real run, not sample by sample.",
        ),
    ] = False,
    out: Annotated[Path | None, typer.Option(help="Also write results as JSON here.")] = None,
) -> None:
    """The mixed example workload of `bench local`, run for real on the local engine and in the
    simulator (profiles measured by `sluice sim profile`), side by side: JCT, makespan, ratios.
    Every flag, policy name and path is checked before the first profile or run: bad input exits 2."""
    from sluice.bench import simreal as bench_simreal

    names = policy_list("--policies", policies)
    workload_flags(stagger, scale, interval)
    in_range("--profile-seconds", profile_seconds, MIN_PROFILE_S, MAX_PROFILE_S)
    if profiles is not None and profiles.exists() and not profiles.is_dir():
        bad_input("--profiles", f"{profiles} is not a folder")
    if real_from is not None:
        if not real_from.is_file():
            bad_input("--real-from", f"{real_from}: no such file")
        try:
            bench_simreal.read_real_runs(real_from)
        except ValueError as err:
            bad_input("--real-from", str(err))
    _out("--out", out)
    bench_simreal.compare(
        names,
        stagger_s=stagger,
        scale=scale,
        policy_interval_s=interval,
        profiles_dir=profiles,
        profile_seconds=profile_seconds,
        refresh_profiles=reprofile,
        real_from=real_from,
        mean_background=mean_background,
        out=out,
    )


@app.command("elastic")
def elastic(
    steps: Annotated[
        int,
        typer.Option(
            min=100,
            max=1_000_000,
            help="Steps of each measuring ddp.py run (its second half gives the steady steps/s the simulator replays).",
        ),
    ] = 1500,
    width: Annotated[
        int, typer.Option(min=8, max=16_384, help="ddp.py's hidden width (sets the gradient size).")
    ] = 256,
    batch: Annotated[
        int,
        typer.Option(
            min=4,
            max=65_536,
            help="ddp.py's global batch, kept at every size (sets the compute per step: a larger batch "
            "makes a step's compute large next to its all-reduce, so more replicas can pay).",
        ),
    ] = 128,
    out: Annotated[Path | None, typer.Option(help="Also write results as JSON here.")] = None,
    policy_steps: Annotated[
        int,
        typer.Option(
            min=0,
            max=10_000_000,
            help="Steps of one longer job run fixed at 1, fixed at 2, and sized by each policy from its "
            "measured speed, each beside the simulator's JCT for it (0: skip that part).",
        ),
    ] = 0,
    contenders: Annotated[
        str,
        typer.Option(help="With --policy-steps: which runs, comma-separated ('fixed N' or a policy name)."),
    ] = "fixed 1,fixed 2,sluice,pollux,optimus,tiresias",
) -> None:
    """examples/ddp.py at 1, 2 and 4 replicas, the seconds lost per resize (2 → 1 → 2), and
    optionally one job under fixed sizes vs each policy's sizing from measured speed, real
    JCT next to the simulator's for the same job."""
    from sluice.bench import elastic as bench_elastic

    names = tuple(c.strip() for c in contenders.split(",") if c.strip())
    for c in names:
        if c.startswith("fixed "):
            if not c.split()[1:] or not c.split()[1].isdigit() or not 1 <= int(c.split()[1]) <= 2:
                raise typer.BadParameter(f"{c!r}: a fixed size is 'fixed 1' or 'fixed 2'", param_hint="--contenders")
        elif c not in ("sluice", "pollux", "optimus", "tiresias"):
            raise typer.BadParameter(
                f"{c!r}: choose fixed 1, fixed 2, sluice, pollux, optimus or tiresias", param_hint="--contenders"
            )
    if not names:
        raise typer.BadParameter("give at least one contender", param_hint="--contenders")
    bench_elastic.run(steps=steps, width=width, batch=batch, out=out, policy_steps=policy_steps, contenders=names)


@app.command("threads")
def threads(
    before_s: Annotated[float, typer.Option(help=f"Seconds measured before the cut (1 to {MAX_MEASURE_S:g}).")] = 15.0,
    after_s: Annotated[float, typer.Option(help=f"Seconds measured after the cut (1 to {MAX_MEASURE_S:g}).")] = 15.0,
    from_cores: Annotated[
        float,
        typer.Option(help=f"CPU limit (cores) the job starts with ({MIN_CORES:g} to {MAX_CPUS_PER_NODE:g})."),
    ] = 2.0,
    to_cores: Annotated[
        float,
        typer.Option(help=f"CPU limit (cores) it is cut to, live ({MIN_CORES:g} to {MAX_CPUS_PER_NODE:g})."),
    ] = 1.0,
    out: Annotated[Path | None, typer.Option(help="Also write results as JSON here.")] = None,
) -> None:
    """A torch job's speed before and after a live CPU cut, with its thread pool left alone
    (SLUICE_THREADS=manual) and following the cut (auto). Bad input exits 2 before the job starts."""
    from sluice.bench import threads as bench_threads

    in_range("--before-s", before_s, 1, MAX_MEASURE_S)
    in_range("--after-s", after_s, 1, MAX_MEASURE_S)
    in_range("--from-cores", from_cores, MIN_CORES, MAX_CPUS_PER_NODE)
    in_range("--to-cores", to_cores, MIN_CORES, MAX_CPUS_PER_NODE)
    _out("--out", out)
    bench_threads.run(before_s=before_s, after_s=after_s, from_cores=from_cores, to_cores=to_cores, out=out)


DATA_MAX_FILES = 100_000
DATA_MAX_LATENCY_MS = 10_000.0
DATA_MAX_LARGE_FILES = 64
DATA_MAX_LARGE_MB = 1024
DATA_MAX_EPOCHS = 100
DATA_SCENARIOS = ("1", "2", "3", "4", "5", "6")


@app.command("data")
def data(
    files: Annotated[
        int, typer.Option(help=f"Small image-like files (3-100 KB) in the dataset (1 to {DATA_MAX_FILES:,}).")
    ] = 20_000,
    remote_files: Annotated[int, typer.Option(help="Files of it read from the remote source (1 to --files).")] = 2_000,
    latency_ms: Annotated[
        float, typer.Option(help=f"Per-request latency of the remote source (ms, 0 to {DATA_MAX_LATENCY_MS:,.0f}).")
    ] = 20.0,
    large_files: Annotated[
        int, typer.Option(help=f"Files in the large-file dataset (1 to {DATA_MAX_LARGE_FILES}).")
    ] = 8,
    large_mb: Annotated[int, typer.Option(help=f"Size of each large file (MiB, 1 to {DATA_MAX_LARGE_MB:,}).")] = 64,
    scenarios: Annotated[str, typer.Option(help="Which scenarios to run (1-6, comma-separated).")] = "1,2,3,4,5,6",
    out: Annotated[Path | None, typer.Option(help="Also write results as JSON here.")] = None,
    two_jobs_epochs: Annotated[
        int,
        typer.Option(help=f"Scenario 4: epochs each of the two jobs reads, in its own order (1 to {DATA_MAX_EPOCHS})."),
    ] = 3,
    remote: Annotated[
        str, typer.Option(help="Remote source: http (sluice's file server) or s3 (moto behind a shaping proxy).")
    ] = "http",
) -> None:
    """The data path vs its baselines: warm cache vs tmpfs and vs remote, merged vs unmerged,
    two jobs sharing a cache, a compute-bound job's overhead, and data-aware placement (sim).
    Every flag is checked before files are made: bad input exits 2."""
    from sluice.bench import data as bench_data

    if remote not in bench_data.REMOTES:
        bad_input("--remote", f"{remote!r} is not one of: {', '.join(bench_data.REMOTES)}")
    wanted = [x.strip() for x in scenarios.split(",") if x.strip()]
    unknown = [x for x in wanted if x not in DATA_SCENARIOS]
    if unknown or not wanted:
        bad_input("--scenarios", f"{', '.join(unknown) or '(none)'}: choose from {', '.join(DATA_SCENARIOS)}")
    in_range("--files", files, 1, DATA_MAX_FILES)
    in_range("--remote-files", remote_files, 1, files)
    in_range("--latency-ms", latency_ms, 0, DATA_MAX_LATENCY_MS)
    in_range("--large-files", large_files, 1, DATA_MAX_LARGE_FILES)
    in_range("--large-mb", large_mb, 1, DATA_MAX_LARGE_MB)
    in_range("--two-jobs-epochs", two_jobs_epochs, 1, DATA_MAX_EPOCHS)
    _out("--out", out)
    if set(wanted) - {"6"}:  # scenario 6 is simulated and makes no files
        import shutil

        base = bench_data.work_base()
        need, free = bench_data.bytes_needed(files, large_files, large_mb), shutil.disk_usage(base).free
        if need > free:  # 64 x 1 GiB on /dev/shm took the machine's memory
            bad_input(
                "--files/--large-files/--large-mb",
                f"the datasets and their copies need up to {need / 2**30:.1f} GiB in {base}, "
                f"which has {free / 2**30:.1f} GiB free; ask for fewer or smaller files",
            )
    bench_data.run(
        two_jobs_epochs=two_jobs_epochs,
        remote=remote,
        files=files,
        remote_files=remote_files,
        latency_ms=latency_ms,
        large_files=large_files,
        large_mb=large_mb,
        scenarios=",".join(wanted),
        out=out,
    )


RAY_PARTS = ("migrate", "loss", "mixed")


@app.command("ray")
def ray(
    policy: Annotated[
        str, typer.Option(help="Policy for the mixed workload on both engines (a `sluice sim policies` name).")
    ] = "flowcon",
    stagger: Annotated[
        float, typer.Option(help=f"Seconds between job arrivals (mixed workload; 0 to {MAX_STAGGER_S:g}).")
    ] = 10.0,
    scale: Annotated[
        float,
        typer.Option(help=f"Scale of each example's length in the mixed workload ({SCALES[0]:g} to {SCALES[1]:g})."),
    ] = 1.0,
    move_scale: Annotated[
        float, typer.Option(help=f"Scale of the examples moved or lost ({SCALES[0]:g} to {SCALES[1]:g}).")
    ] = 0.5,
    interval: IntervalOpt = 10.0,
    parts: Annotated[
        str, typer.Option(help="Which parts: migrate, loss, mixed (comma-separated).")
    ] = "migrate,loss,mixed",
    out: Annotated[Path | None, typer.Option(help="Also write results as JSON here.")] = None,
) -> None:
    """The Ray engine on a 3-node Ray cluster on this machine: migration time per example job,
    recovery after node loss, and the mixed workload on the local engine vs Ray side by side.
    Every flag and the policy name are checked before Ray starts: bad input exits 2."""
    from sluice.bench import ray as bench_ray

    wanted = {p.strip() for p in parts.split(",") if p.strip()}
    unknown = wanted - set(RAY_PARTS)
    if unknown or not wanted:
        bad_input(
            "--parts", f"unknown part(s) {', '.join(sorted(unknown)) or '(none)'}; choose from {', '.join(RAY_PARTS)}"
        )
    if "," in policy:
        bad_input("--policy", f"one policy, got {policy!r}")
    policy_list("--policy", policy)
    workload_flags(stagger, scale, interval)
    in_range("--move-scale", move_scale, *SCALES)
    _out("--out", out)
    bench_ray.run(
        policy.strip(),
        stagger_s=stagger,
        scale=scale,
        move_scale=move_scale,
        policy_interval_s=interval,
        parts=parts,
        out=out,
    )


@app.command("agent")
def agent(
    jobs: Annotated[int, typer.Option(help="SDK jobs running at once (1 to 64).")] = 6,
    seconds: Annotated[float, typer.Option(help=f"Seconds measured per contender (1 to {MAX_MEASURE_S:g}).")] = 30.0,
    interval: Annotated[float, typer.Option(help="Seconds between polls (reconcile interval; 0.05 to 60).")] = 0.5,
) -> None:
    """What watching jobs costs the node agent (CPU % of one core): cgroup counters vs the
    affinity fallback's process-tree sampling, side by side. Bad input exits 2 before any job starts."""
    from sluice.bench import agent as bench_agent

    in_range("--jobs", jobs, 1, 64)
    in_range("--seconds", seconds, 1, MAX_MEASURE_S)
    in_range("--interval", interval, 0.05, 60)

    bench_agent.run(jobs=jobs, seconds=seconds, interval=interval)


HEALTH_MAX_MINUTES = 1440.0
"""Longest live health run (fault-free or campaign): a day."""

MAX_WINDOW_STEPS = 16
"""Largest --window-steps: a node model's input is history + window steps of every KPI, and
the replayed monitor fits one per node on the learning period's few hundred samples."""


@app.command("health")
def health(
    folder: Annotated[
        Path | None, typer.Argument(help="Folder of NAME.npz files; default shared/data/anomaly/asd.")
    ] = None,
    entities: Annotated[str | None, typer.Option(help="Comma-separated entity names; default all.")] = None,
    out: Annotated[Path | None, typer.Option(help="Also write results as JSON here.")] = None,
    fault_free_minutes: Annotated[
        float,
        typer.Option(
            help=f"Instead: run the demo workload this long with no fault; count cordons (0 to {HEALTH_MAX_MINUTES:g})."
        ),
    ] = 0.0,
    inject_io_at_minute: Annotated[
        float | None,
        typer.Option(
            help="With --fault-free-minutes: start a 90 s I/O storm on the last node at this minute "
            "(0 to --fault-free-minutes)."
        ),
    ] = None,
    campaign: Annotated[
        bool,
        typer.Option(
            "--campaign",
            help="Instead: run the demo workload and inject cpu, memory, io and net faults at seeded random times on "
            "random nodes; report per fault cordoned or not, after how long, jobs moved and finished, false cordons.",
        ),
    ] = False,
    minutes: Annotated[
        float, typer.Option(help=f"With --campaign: how long, learning included (1 to {HEALTH_MAX_MINUTES:g}).")
    ] = 60.0,
    seed: Annotated[
        int, typer.Option(help=f"With --campaign: seed of the fault order, nodes and gaps (0 to {MAX_SEED}).")
    ] = 1,
    fault_seconds: Annotated[float, typer.Option(help="With --campaign: each fault's length (5 to 3600 s).")] = 90.0,
    record: Annotated[
        Path | None,
        typer.Option(
            help="With --campaign: write each node's KPIs as DIR/<node>.npz (train before the first fault, test "
            "after, test_label 1 while a fault ran on that node), readable by `sluice health eval DIR`."
        ),
    ] = None,
    replay: Annotated[
        Path | None,
        typer.Option(
            help="Instead: feed a campaign's recorded X.trace.jsonl (from --campaign --out X.json) through today's "
            "health monitor, offline, and report per fault the cordon delay next to the live one's, and every "
            "false cordon. Reads X.json beside it for each fault's node and kind.",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ] = None,
    threshold: Annotated[
        str | None,
        typer.Option(
            help="With --replay: the monitor's threshold rule, 'dspot' (drift-aware, the default) or 'spot', "
            "to compare the two on one recording."
        ),
    ] = None,
    window_steps: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=MAX_WINDOW_STEPS,
            help="With --replay: the steps each node model judges jointly (the live monitor's 1, the offline "
            "detector's 4), to compare them on one recording.",
        ),
    ] = None,
) -> None:
    """Flow detector vs PCA, Isolation Forest and an autoencoder, averaged, with ratios.
    Every flag is checked before anything runs: bad input exits 2."""
    from sluice.bench import health as bench_health

    in_range("--fault-free-minutes", fault_free_minutes, 0, HEALTH_MAX_MINUTES)
    if inject_io_at_minute is not None:
        if fault_free_minutes <= 0:
            bad_input("--inject-io-at-minute", "only used with --fault-free-minutes")
        in_range("--inject-io-at-minute", inject_io_at_minute, 0, fault_free_minutes)
    in_range("--minutes", minutes, 1, HEALTH_MAX_MINUTES)
    in_range("--seed", seed, 0, MAX_SEED)
    in_range("--fault-seconds", fault_seconds, 5, 3600)
    if folder is not None and replay is None and not campaign and fault_free_minutes <= 0 and not folder.is_dir():
        bad_input("FOLDER", f"{folder}: no such folder")
    _out("--out", out)

    if threshold is not None and replay is None:
        typer.echo("error: --threshold: only used with --replay", err=True)
        raise typer.Exit(2)
    if threshold is not None and threshold not in ("spot", "dspot"):
        typer.echo(f"error: --threshold: {threshold!r} is not 'spot' or 'dspot'", err=True)
        raise typer.Exit(2)
    if window_steps is not None and replay is None:
        typer.echo("error: --window-steps: only used with --replay", err=True)
        raise typer.Exit(2)
    if replay is not None:
        if campaign or record is not None:
            typer.echo("error: --replay: replays a recorded campaign; not with --campaign or --record", err=True)
            raise typer.Exit(2)
        from rich.console import Console

        from sluice.bench.health_replay import replay as run_replay
        from sluice.bench.health_replay import report as replay_report

        try:
            replayed = run_replay(replay, threshold=threshold, window_steps=window_steps)
        except (ValueError, KeyError, TypeError) as err:
            typer.echo(f"error: --replay: {replay} is not a campaign trace ({type(err).__name__}: {err})", err=True)
            raise typer.Exit(2) from err
        replay_report(Console(soft_wrap=True), replayed)
        return
    if campaign:
        from sluice.bench.health_campaign import campaign as run_campaign

        result = run_campaign(minutes, seed=seed, fault_s=fault_seconds, out=out, record=record)
        raise typer.Exit(0 if all(result.goals().values()) else 1)
    if record is not None:
        typer.echo("error: --record: only used with --campaign (the faults are what labels the traces)", err=True)
        raise typer.Exit(2)
    if fault_free_minutes > 0:
        bench_health.false_alarms(fault_free_minutes, inject_io_at_min=inject_io_at_minute)
        return
    only = [e.strip() for e in entities.split(",") if e.strip()] if entities else None
    bench_health.run(folder or bench_health.DEFAULT_DIR, only, out)


FAIR_MAX_START_DAY = 3650.0
"""Latest window start of `bench fairness`: ten years into a trace (Philly's spans months)."""


@app.command("fairness")
def fairness(
    trace: Annotated[
        Path | None, typer.Option(help="The Philly trace CSV (default: philly.csv under SLUICE_POLLUX_DATA/traces).")
    ] = None,
    start_day: Annotated[
        float, typer.Option(help=f"First day of the window, from the trace's start (0 to {FAIR_MAX_START_DAY:g}).")
    ] = 40.0,
    hours: Annotated[float, typer.Option(help="Length of the window (hours, 1 to 720).")] = 48.0,
    nodes: Annotated[int, typer.Option(help="Nodes of 8 GPUs (1 to 10,000).")] = 32,
    interval: Annotated[float, typer.Option(help="Seconds between scheduling rounds (1 to 3600).")] = 60.0,
    grace: Annotated[
        float, typer.Option(help="A job may wait this long within its quota before it counts (s, 0 to 86,400).")
    ] = 300.0,
    preempt_min_runtime: Annotated[
        float, typer.Option(help="Admission never preempts a job placed less than this ago (s, 0 to 86,400).")
    ] = 600.0,
    max_jobs: Annotated[
        int | None, typer.Option(help=f"Only the first N jobs of the window (1 to {SIM_MAX_SCALE_JOBS:,}).")
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help=f"Parallel simulations, 1 to {SIM_MAX_WORKERS} (default: one per core).")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Also write results as JSON here.")] = None,
) -> None:
    """Queues on the Philly trace: no quotas vs strict quotas vs borrowing + DRF vs borrowing +
    DRF + preemption (utilisation, JCT per tenant against its JCT alone on its quota, Jain's
    index, guarantee violations)."""
    from sluice.bench import fairness as bench_fairness

    in_range("--start-day", start_day, 0, FAIR_MAX_START_DAY)
    in_range("--hours", hours, 1, 24 * 30)
    in_range("--nodes", nodes, 1, 10_000)
    in_range("--interval", interval, 1, 3600)
    in_range("--grace", grace, 0, 86_400)
    in_range("--preempt-min-runtime", preempt_min_runtime, 0, 86_400)
    in_range("--max-jobs", max_jobs, 1, SIM_MAX_SCALE_JOBS)
    in_range("--workers", workers, 1, SIM_MAX_WORKERS)
    _out("--out", out)
    if trace is not None and not trace.is_file():
        bad_input("--trace", f"{trace}: no such file")
    from sluice.control.simulate import SimDataMissing, require_pollux_data

    try:
        path = trace or require_pollux_data("traces/philly.csv") / "traces" / "philly.csv"
    except SimDataMissing as err:
        _missing_data(err)
    try:
        bench_fairness.run(
            trace=path,
            start_day=start_day,
            hours=hours,
            nodes=nodes,
            interval_s=interval,
            grace_s=grace,
            preempt_min_runtime_s=preempt_min_runtime,
            max_jobs=max_jobs,
            workers=workers,
            out=out,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def _usage(flag: str, problem: str) -> NoReturn:
    """Bad input to a bench: one line `error: FLAG: PROBLEM` on stderr, exit 2, before any work."""
    bad_input(flag, problem)


def _names(flag: str, given: str | None, valid: list[str]) -> list[str] | None:
    """A comma-separated list of policy names, each one of `valid` (None: not given)."""
    if given is None:
        return None
    names = [p.strip() for p in given.split(",") if p.strip()]
    if not names:
        _usage(flag, f"give at least one policy: {', '.join(valid)}")
    unknown = [n for n in names if n not in valid]
    if unknown:
        _usage(flag, f"unknown policy {', '.join(map(repr, unknown))}; choose from {', '.join(valid)}")
    _once(flag, names)
    return names


def _once(flag: str, items: list[Any]) -> None:
    """A name or number given twice would run twice and be counted twice (restarts, k/n): refused."""
    twice = sorted({str(x) for x in items if items.count(x) > 1})
    if twice:
        _usage(flag, f"{', '.join(twice)} given more than once; give each once")


SIM_ALL_LOADS = "0.5,1.0,1.5,2.0"
SIM_ALL_WORKLOADS = "1,2,3,4,5,6,7,8"
SIM_SCALE_POLICY = "sluice"
SIM_SCALE_JOBS = 20_000
SIM_SCALE_NODES = 5_000
SIM_SCALE_LOAD_FACTOR = 10.0
"""`bench sim`'s defaults; a flag of a part that is not run, given any other value, is refused."""


@app.command("sim")
def sim(
    parts: Annotated[str, typer.Option(help="Which parts: pollux, cpu, scale (comma-separated).")] = "pollux,cpu",
    policies: Annotated[
        str | None,
        typer.Option(
            help="GPU policies for the pollux part, comma-separated (default: fifo, binpack, kube, tiresias, "
            "optimus, pollux, pollux-prior, sluice, sluice-prior): any `sluice sim policies` name, variants "
            "included: pollux-prior, sluice-prior (the fixed speed-up prior), sluice-gns (gradient noise scale)."
        ),
    ] = None,
    loads: Annotated[
        str, typer.Option(help="Load levels of the Pollux workloads (0.5, 1.0, 1.5, 2.0).")
    ] = SIM_ALL_LOADS,
    workloads: Annotated[
        str,
        typer.Option(help="Pollux workload numbers (1-8); the published results are set beside the same workloads."),
    ] = SIM_ALL_WORKLOADS,
    cpu_policies: Annotated[
        str | None,
        typer.Option(
            help="Policies for the CPU-job setups, comma-separated `sluice sim policies` names but the "
            "variants, which change GPU speed-ups only (default: kube, flowcon, specon, dqoes, sluice)."
        ),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help=f"Parallel simulations, 1 to {SIM_MAX_WORKERS} (default: one per core).")
    ] = None,
    scale_policy: Annotated[
        str, typer.Option(help="Policy for the scale run (a `sluice sim policies` name, variants included).")
    ] = SIM_SCALE_POLICY,
    scale_jobs: Annotated[
        int, typer.Option(help=f"Philly jobs in the scale run (1 to {SIM_MAX_SCALE_JOBS:,}).")
    ] = SIM_SCALE_JOBS,
    scale_nodes: Annotated[
        int, typer.Option(help=f"Nodes (8 GPUs each) in the scale run (1 to {SIM_MAX_SCALE_NODES:,}).")
    ] = SIM_SCALE_NODES,
    scale_load_factor: Annotated[
        float,
        typer.Option(
            help=f"Arrival compression of the Philly window ({SIM_LOAD_FACTORS[0]:g} to {SIM_LOAD_FACTORS[1]:g})."
        ),
    ] = SIM_SCALE_LOAD_FACTOR,
    scale_hours: Annotated[
        float | None,
        typer.Option(
            help="Stop the scale run after this many virtual hours (above 0, at most "
            f"{SIM_MAX_SCALE_HOURS:,.0f}; default: run to the end)."
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Also write results as JSON here.")] = None,
    oracle: Annotated[
        bool,
        typer.Option(
            "--oracle",
            help="Give policies the simulator's ground truth (exact remaining work and speedups): an upper-bound "
            "study, labelled 'oracle (upper bound)' in every table and the JSON. Off: only what a real engine sees.",
        ),
    ] = False,
) -> None:
    """Every policy in the simulator: the eight Pollux workloads at four loads beside the published
    Pollux/Optimus/Tiresias numbers, FlowCon's CPU setups vs kube, and a Philly scale run.
    Every flag and policy name is checked before the first simulation: bad input exits 2."""
    from sluice.bench import sim as bench_sim
    from sluice.control.simulate import SimDataMissing, policy_names

    names = {p.strip() for p in parts.split(",") if p.strip()}
    unknown = names - {"pollux", "cpu", "scale"}
    if unknown or not names:
        _usage("--parts", f"unknown part(s) {', '.join(sorted(unknown)) or '(none)'}; choose from pollux, cpu, scale")
    load_list = [x.strip() for x in loads.split(",") if x.strip()]
    bad = [x for x in load_list if x not in bench_sim.LOADS]
    if bad or not load_list:
        _usage("--loads", f"{', '.join(bad) or '(none)'}: choose from {', '.join(bench_sim.LOADS)}")
    _once("--loads", load_list)
    try:
        wl = [int(x) for x in workloads.split(",") if x.strip()]
    except ValueError:
        _usage("--workloads", "give workload numbers 1-8, comma-separated")
    if not wl or any(w < 1 or w > 8 for w in wl):
        _usage("--workloads", "give workload numbers 1-8, comma-separated")
    _once("--workloads", wl)
    registered = policy_names()  # variants included: the pollux and scale parts run GPU jobs
    gpu_names = _names("--policies", policies, registered)
    cpu_names = _names("--cpu-policies", cpu_policies, policy_names(variants=False))
    if scale_policy not in registered:
        _usage("--scale-policy", f"unknown policy {scale_policy!r}; choose from {', '.join(registered)}")
    if workers is not None and not 1 <= workers <= SIM_MAX_WORKERS:
        _usage("--workers", f"must be 1 to {SIM_MAX_WORKERS}, got {workers}")
    if not 1 <= scale_jobs <= SIM_MAX_SCALE_JOBS:
        _usage("--scale-jobs", f"must be 1 to {SIM_MAX_SCALE_JOBS}, got {scale_jobs}")
    if not 1 <= scale_nodes <= SIM_MAX_SCALE_NODES:
        _usage("--scale-nodes", f"must be 1 to {SIM_MAX_SCALE_NODES}, got {scale_nodes}")
    lo, hi = SIM_LOAD_FACTORS
    if not (math.isfinite(scale_load_factor) and lo <= scale_load_factor <= hi):
        _usage("--scale-load-factor", f"must be a number from {lo:g} to {hi:g}, got {scale_load_factor:g}")
    if scale_hours is not None and not (math.isfinite(scale_hours) and 0 < scale_hours <= SIM_MAX_SCALE_HOURS):
        _usage("--scale-hours", f"must be a number above 0 and at most {SIM_MAX_SCALE_HOURS:g}, got {scale_hours:g}")
    _part_flags(
        names,
        {
            "--policies": ("pollux", policies is not None),
            "--loads": ("pollux", loads != SIM_ALL_LOADS),
            "--workloads": ("pollux", workloads != SIM_ALL_WORKLOADS),
            "--cpu-policies": ("cpu", cpu_policies is not None),
            "--scale-policy": ("scale", scale_policy != SIM_SCALE_POLICY),
            "--scale-jobs": ("scale", scale_jobs != SIM_SCALE_JOBS),
            "--scale-nodes": ("scale", scale_nodes != SIM_SCALE_NODES),
            "--scale-load-factor": ("scale", scale_load_factor != SIM_SCALE_LOAD_FACTOR),
            "--scale-hours": ("scale", scale_hours is not None),
        },
    )
    _out("--out", out)

    try:
        bench_sim.run(
            parts=sorted(names),
            policies=gpu_names,
            loads=load_list,
            workloads=wl,
            cpu_policies=cpu_names,
            workers=workers,
            scale_policy=scale_policy,
            scale_jobs=scale_jobs,
            scale_nodes=scale_nodes,
            scale_load_factor=scale_load_factor,
            scale_hours=scale_hours,
            out=out,
            oracle=oracle,
        )
    except SimDataMissing as err:
        _missing_data(err)


def _part_flags(parts: set[str], flags: dict[str, tuple[str, bool]]) -> None:
    """A flag of a part that is not run would be ignored without a word: refused, naming the part."""
    for flag, (part, given) in flags.items():
        if given and part not in parts:
            _usage(
                flag,
                f"applies to the {part} part, which is not run (--parts {','.join(sorted(parts))}); "
                f"add {part} to --parts",
            )


def _missing_data(err: Exception) -> NoReturn:
    """Report data the simulator lacks in one line naming the setting (exit 2), never a traceback."""
    from sluice.cli.client import EXIT_USAGE, CliError
    from sluice.cli.output import fail

    fail(CliError(str(err), EXIT_USAGE))
