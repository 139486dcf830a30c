"""Workloads: lists of jobs with submission times, from files or generated.

Readers: the Pollux workload CSVs (`name,time,application,num_replicas,batch_size`), the
Philly trace (`timestamp,duration,num_gpus,...`, sampled by window and load factor), and any
Helios/Acme-style CSV (`submit_time,duration,gpu_num,user,...`) — detected by their columns,
so a new trace of either shape plugs in without code.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sluice.sim.replicas import ReplicaProfile


class WorkloadError(ValueError):
    """A workload file that cannot be read; the message names the file, row and column."""


MAX_DURATION_S = 1e8
"""The longest job a trace row may give (about 3 years; the Philly trace's longest is 54 days)."""
MAX_SPAN_S = 1e9
"""The latest arrival a workload may have, in seconds after its first (about 31 years)."""
MAX_JOB_GPUS = 1_000_000
"""The most GPUs a workload row may ask for (whether the cluster has them is the caller's check)."""
MAX_BATCH_SIZE = 10_000_000


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


def _num(row: dict[str, str], col: str, path: Path, line: int, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite number in [lo, hi] from the row; WorkloadError naming the file, row and column otherwise."""
    try:
        v = float(row[col])
    except (KeyError, TypeError, ValueError):
        raise WorkloadError(f"{path}:{line}: column {col!r} must be a number, got {row.get(col)!r}") from None
    if not math.isfinite(v):
        raise WorkloadError(f"{path}:{line}: column {col!r} must be a finite number, got {row.get(col)!r}")
    if not lo <= v <= hi:
        raise WorkloadError(f"{path}:{line}: column {col!r} must be from {_show(lo)} to {_show(hi)}, got {_show(v)}")
    return v


def _show(x: float) -> str:
    """A number as typed: whole ones in full (100000000, not 1e+08), others short."""
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:g}"


def _whole(row: dict[str, str], col: str, path: Path, line: int, lo: int, hi: int) -> int:
    """A whole number in [lo, hi] from the row (`2` or `2.0`)."""
    v = _num(row, col, path, line, lo, hi)
    if not v.is_integer():
        raise WorkloadError(f"{path}:{line}: column {col!r} must be a whole number, got {_show(v)}")
    return int(v)


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
    notes: list[str] | None = None,
) -> list[WorkloadJob]:
    """Read any supported workload file, recognised by its header.

    A row with a value that is not a finite number in its range (negative GPUs or duration, a
    duration over MAX_DURATION_S, arrivals spread over more than MAX_SPAN_S) is refused with a
    WorkloadError naming the file, row and column. Trace rows with 0 GPUs or 0 duration are
    valid records of no GPU work (CPU-only jobs): skipped, and counted in `notes` when given."""
    if not (math.isfinite(load_factor) and load_factor > 0):
        raise WorkloadError(f"load factor must be a positive number, got {load_factor}")
    if window_start_h is not None and not (math.isfinite(window_start_h) and window_start_h >= 0):
        raise WorkloadError(f"window start must be a non-negative number of hours, got {window_start_h}")
    if window_hours is not None and not (math.isfinite(window_hours) and window_hours > 0):
        raise WorkloadError(f"window length must be a positive number of hours, got {window_hours}")
    p = Path(path)
    if not p.exists():
        raise WorkloadError(f"workload file {p} does not exist")
    if p.is_dir():
        raise WorkloadError(f"{p} is a directory, not a workload file")
    if not p.is_file():
        raise WorkloadError(f"{p} is not a regular file (a device or a pipe?), not a workload file")
    try:
        with p.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            cols = set(reader.fieldnames or [])
            rows = list(reader)
    except UnicodeDecodeError:
        raise WorkloadError(f"{p} is not a text CSV file (binary content)") from None
    except csv.Error as err:
        raise WorkloadError(f"{p} is not a readable CSV file ({err})") from None
    if {"time", "application", "num_replicas", "batch_size"} <= cols:
        jobs = _pollux(rows, p)
        if load_factor != 1.0:
            jobs = _scale_arrivals(jobs, load_factor)
    elif {"timestamp", "duration", "num_gpus"} <= cols:
        jobs = _trace(rows, p, "timestamp", "duration", "num_gpus", "cluster", notes)
        jobs = _window(jobs, window_start_h, window_hours, load_factor, seed)
    elif {"submit_time", "duration", "gpu_num"} <= cols:
        jobs = _trace(rows, p, "submit_time", "duration", "gpu_num", "user", notes)
        jobs = _window(jobs, window_start_h, window_hours, load_factor, seed)
    else:
        shown = sorted(cols)[:12]
        more = f" and {len(cols) - len(shown)} more" if len(cols) > len(shown) else ""
        raise WorkloadError(
            f"{p}: unrecognised columns {', '.join(repr(c[:40]) for c in shown) or '(none)'}{more}; expected Pollux "
            "(name,time,application,num_replicas,batch_size), Philly (timestamp,duration,num_gpus) "
            "or Helios/Acme (submit_time,duration,gpu_num,user)"
        )
    jobs.sort(key=lambda j: (j.submit_time, j.name))
    return jobs[:max_jobs] if max_jobs else jobs


def _pollux(rows: list[dict[str, str]], path: Path) -> list[WorkloadJob]:
    out = []
    for i, r in enumerate(rows, start=2):
        out.append(
            WorkloadJob(
                name=r.get("name") or f"job-{i - 2}",
                submit_time=_num(r, "time", path, i, 0.0, MAX_SPAN_S),
                kind="gpu",
                gpus=_whole(r, "num_replicas", path, i, 1, MAX_JOB_GPUS),
                application=(r.get("application") or "").strip(),
                batch_size=_whole(r, "batch_size", path, i, 1, MAX_BATCH_SIZE),
            )
        )
    return out


def _trace(
    rows: list[dict[str, str]],
    path: Path,
    t_col: str,
    d_col: str,
    g_col: str,
    u_col: str,
    notes: list[str] | None = None,
) -> list[WorkloadJob]:
    out: list[tuple[int, WorkloadJob]] = []
    skipped = 0
    for i, r in enumerate(rows, start=2):
        try:
            t = _time(r[t_col])
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            raise WorkloadError(f"{path}:{i}: column {t_col!r} is not a time: {r.get(t_col)!r}") from None
        if not math.isfinite(t):
            raise WorkloadError(f"{path}:{i}: column {t_col!r} must be a finite time, got {r.get(t_col)!r}")
        dur = _num(r, d_col, path, i, 0.0, MAX_DURATION_S)
        gpus = _whole(r, g_col, path, i, 0, MAX_JOB_GPUS)
        if dur == 0 or gpus == 0:
            skipped += 1  # CPU-only or zero-length records of a GPU trace carry no GPU work
            continue
        job = WorkloadJob(
            name=r.get("job_id") or r.get("name") or f"trace-{i - 2}",
            submit_time=t,
            kind="trace",
            gpus=gpus,
            duration_s=dur,
            user=(r.get(u_col) or "default").strip() or "default",
        )
        out.append((i, job))
    if out:
        t0 = min(j.submit_time for _, j in out)
        late = next(((i, j) for i, j in out if j.submit_time - t0 > MAX_SPAN_S), None)
        if late is not None:
            raise WorkloadError(
                f"{path}:{late[0]}: column {t_col!r}: arrives {_show(late[1].submit_time - t0)} s after the first "
                f"job; a workload may span at most {_show(MAX_SPAN_S)} s"
            )
    if skipped and notes is not None:
        notes.append(f"skipped {skipped} row(s) with 0 GPUs or 0 duration (no GPU work to simulate)")
    return [j for _, j in out]


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
