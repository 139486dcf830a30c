"""Workloads: lists of jobs with submission times, from files or generated.

Readers: the Pollux workload CSVs (`name,time,application,num_replicas,batch_size`), the
Philly trace (`timestamp,duration,num_gpus,...`, sampled by window and load factor), and any
Helios/Acme-style CSV (`submit_time,duration,gpu_num,user,...`) — detected by their columns,
so a new trace of either shape plugs in without code.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sluice.sim.replicas import ReplicaProfile


class WorkloadError(ValueError):
    """A workload file that cannot be read; the message names the file, row and column."""


@dataclass(frozen=True)
class WorkloadJob:
    """One job of a workload.

    kind: "gpu" (a measured application), "trace" (duration × GPUs from a trace), "cpu",
          "data" (reads `dataset` for `epochs` epochs of `epoch_s` compute each, on `cpus` cores),
          or "replicas" (a CPU data-parallel job of `cpu_steps` steps, `replicas_min` to
          `replicas_max` replicas of `cpus` cores, its speed per count from `replica_profile`).
    submit_time: seconds from the start of the workload.
    """

    name: str
    submit_time: float
    kind: str
    gpus: int = 1
    application: str | None = None
    batch_size: int | None = None
    duration_s: float | None = None
    user: str = "default"
    cpu_profile: str | None = None
    cpu_steps: int | None = None
    qoe_loss: float | None = None
    qoe_deadline_s: float | None = None
    dataset: str | None = None
    epochs: int | None = None
    epoch_s: float | None = None
    cpus: float | None = None
    cpu_max: float | None = None
    """CPU jobs: the spec's `resources.cpu.max` (None: the node's size), as a real spec would carry."""
    queue: str = "default"
    """The queue the job is submitted to (docs/queues.md); `sluice bench fairness` sets it."""
    replicas_min: int = 1
    replicas_max: int = 1
    replica_profile: ReplicaProfile | None = None
    """"replicas" jobs: steps/s per replica count and the start, resize and end times, as
    measured (`sluice bench elastic`)."""


def _num(row: dict[str, str], col: str, path: Path, line: int) -> float:
    try:
        return float(row[col])
    except (KeyError, TypeError, ValueError):
        raise WorkloadError(f"{path}:{line}: column {col!r} must be a number, got {row.get(col)!r}") from None


def _time(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return datetime.fromisoformat(value.strip()).timestamp()


def load_workload(
    path: str | Path,
    *,
    load_factor: float = 1.0,
    window_start_h: float | None = None,
    window_hours: float | None = None,
    max_jobs: int | None = None,
    seed: int = 0,
) -> list[WorkloadJob]:
    """Read any supported workload file, recognised by its header."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"workload file {p} does not exist")
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        cols = set(reader.fieldnames or [])
        rows = list(reader)
    if {"time", "application", "num_replicas", "batch_size"} <= cols:
        jobs = _pollux(rows, p)
        if load_factor != 1.0:
            jobs = _scale_arrivals(jobs, load_factor)
    elif {"timestamp", "duration", "num_gpus"} <= cols:
        jobs = _trace(rows, p, "timestamp", "duration", "num_gpus", "cluster")
        jobs = _window(jobs, window_start_h, window_hours, load_factor, seed)
    elif {"submit_time", "duration", "gpu_num"} <= cols:
        jobs = _trace(rows, p, "submit_time", "duration", "gpu_num", "user")
        jobs = _window(jobs, window_start_h, window_hours, load_factor, seed)
    else:
        raise WorkloadError(
            f"{p}: unrecognised columns {sorted(cols)}; expected Pollux "
            "(name,time,application,num_replicas,batch_size), Philly (timestamp,duration,num_gpus) "
            "or Helios/Acme (submit_time,duration,gpu_num,user)"
        )
    jobs.sort(key=lambda j: (j.submit_time, j.name))
    return jobs[:max_jobs] if max_jobs else jobs


def _pollux(rows: list[dict[str, str]], path: Path) -> list[WorkloadJob]:
    out = []
    for i, r in enumerate(rows, start=2):
        gpus = int(_num(r, "num_replicas", path, i))
        if gpus < 1:
            raise WorkloadError(f"{path}:{i}: column 'num_replicas' must be at least 1, got {gpus}")
        out.append(
            WorkloadJob(
                name=r.get("name") or f"job-{i - 2}",
                submit_time=_num(r, "time", path, i),
                kind="gpu",
                gpus=gpus,
                application=r["application"].strip(),
                batch_size=int(_num(r, "batch_size", path, i)),
            )
        )
    return out


def _trace(rows: list[dict[str, str]], path: Path, t_col: str, d_col: str, g_col: str, u_col: str) -> list[WorkloadJob]:
    out = []
    for i, r in enumerate(rows, start=2):
        try:
            t = _time(r[t_col])
        except (ValueError, KeyError):
            raise WorkloadError(f"{path}:{i}: column {t_col!r} is not a time: {r.get(t_col)!r}") from None
        dur = _num(r, d_col, path, i)
        gpus = int(_num(r, g_col, path, i))
        if dur <= 0 or gpus <= 0:
            continue  # CPU-only or zero-length records of a GPU trace carry no GPU work
        out.append(
            WorkloadJob(
                name=r.get("job_id") or r.get("name") or f"trace-{i - 2}",
                submit_time=t,
                kind="trace",
                gpus=gpus,
                duration_s=dur,
                user=(r.get(u_col) or "default").strip() or "default",
            )
        )
    return out


def _window(
    jobs: list[WorkloadJob], start_h: float | None, hours: float | None, load_factor: float, seed: int
) -> list[WorkloadJob]:
    """Cut a window of the trace, shift it to start at 0 and apply the load factor: factor < 1
    keeps a random share of the jobs, factor > 1 compresses the arrival times."""
    if not jobs:
        return jobs
    t0 = min(j.submit_time for j in jobs)
    begin = t0 + (start_h or 0.0) * 3600.0
    end = begin + hours * 3600.0 if hours else float("inf")
    sel = [j for j in jobs if begin <= j.submit_time < end]
    rng = random.Random(seed)
    if load_factor < 1.0:
        sel = [j for j in sel if rng.random() < load_factor]
    scale = 1.0 / load_factor if load_factor > 1.0 else 1.0
    return [_shift(j, (j.submit_time - begin) * scale) for j in sel]


def _scale_arrivals(jobs: list[WorkloadJob], load_factor: float) -> list[WorkloadJob]:
    if load_factor <= 0:
        raise WorkloadError(f"load factor must be positive, got {load_factor}")
    return [_shift(j, j.submit_time / load_factor) for j in jobs]


def _shift(j: WorkloadJob, t: float) -> WorkloadJob:
    from dataclasses import replace

    return replace(j, submit_time=t)


def cpu_workload(
    n_jobs: int,
    *,
    stagger_s: float = 30.0,
    profiles: tuple[str, ...] = ("mnist-cnn", "cifar-resnet", "lstm", "mlp"),
    steps: tuple[int, int] = (1500, 6000),
    qoe_fraction: float = 0.5,
    deadline_factor: float = 1.5,
    seed: int = 0,
) -> list[WorkloadJob]:
    """A FlowCon-style CPU workload: `n_jobs` container jobs from the parametric profile
    families, arriving every `stagger_s` seconds. A `qoe_fraction` of them carry a DQoES
    target: the loss the job reaches at 40 % of its steps, by `deadline_factor` × the time
    that takes with the cores it can use."""
    from sluice.sim.cpu_profiles import family_curve

    rng = random.Random(seed)
    out = []
    for i in range(n_jobs):
        prof = profiles[i % len(profiles)]
        n_steps = rng.randint(*steps)
        curve = family_curve(prof)
        qoe = rng.random() < qoe_fraction
        at = 0.4 * n_steps
        alone = at / curve.throughput(curve.saturation)
        out.append(
            WorkloadJob(
                name=f"{prof}-{i}",
                submit_time=i * stagger_s,
                kind="cpu",
                gpus=0,
                cpu_profile=prof,
                cpu_steps=n_steps,
                qoe_loss=round(curve.loss_at(at), 4) if qoe else None,
                qoe_deadline_s=round(deadline_factor * alone, 1) if qoe else None,
            )
        )
    return out


def data_workload(n_jobs: int, *, n_datasets: int = 40, seed: int = 0) -> tuple[list[WorkloadJob], dict[str, int]]:
    """Jobs that each read a dataset (Kang et al.'s data-aware placement setting), and the
    datasets' sizes: ~120 GB each (log-normal), Zipf popularity (s = 1.1), arrivals every 90 s
    on average (Poisson), 2/4/8 cores, 2-6 epochs of 200-900 s of compute."""
    import math

    rng = random.Random(seed)
    sizes = {f"ds{d}": int(rng.lognormvariate(math.log(120e9), 0.6)) for d in range(n_datasets)}
    weights = [1 / (d + 1) ** 1.1 for d in range(n_datasets)]
    jobs = []
    t = 0.0
    for j in range(n_jobs):
        t += rng.expovariate(1 / 90.0)
        dataset = rng.choices(list(sizes), weights)[0]
        cpus = rng.choice((2.0, 4.0, 8.0))
        epochs = rng.randint(2, 6)
        epoch_s = rng.uniform(200, 900)
        jobs.append(
            WorkloadJob(f"j{j:04d}", t, "data", gpus=0, dataset=dataset, epochs=epochs, epoch_s=epoch_s, cpus=cpus)
        )
    return jobs, sizes


def write_workload(jobs: list[WorkloadJob], path: str | Path) -> None:
    """Write a trace-style workload (Helios/Acme columns) so it can be read back."""
    with Path(path).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submit_time", "duration", "gpu_num", "user"])
        for j in jobs:
            w.writerow([j.name, f"{j.submit_time:.1f}", f"{j.duration_s or 0:.1f}", j.gpus, j.user])
