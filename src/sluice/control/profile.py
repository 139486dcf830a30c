"""`sluice sim profile`: measure a real example job at several CPU limits on the local engine
and save the curves the simulator's CPU jobs follow.

The job runs through the production Controller with a one-line policy that pins it at one
CPU limit (a real kernel CFS quota on the local engine), once per limit, each run cut
`seconds` after its first progress report. Steady-state steps/s per limit gives the
throughput curve; the loss reports of the longest run give the learning curve. The time
from the process's start to its first report, less the steps that report covers, is the
start-up at that limit; fitted over the limits as fixed latency plus single-threaded CPU
work (`fit_startup`), it is what a simulated job pays on every (re)start.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sluice.control.controller import Controller
from sluice.model import (
    Allocation,
    ClusterView,
    Decision,
    Event,
    JobProgress,
    JobStarted,
    JobUsage,
    NodeDecision,
    Place,
)
from sluice.settings import Settings
from sluice.sim.jobs import CpuCurve
from sluice.spec import JobSpec, load_job_spec
from sluice.store import MemoryStore


@dataclass
class _Pin:
    """Place every queued job on the first node at exactly `limit` cores."""

    limit: float
    name: str = "pin"

    def decide(self, view: ClusterView) -> list[Decision]:
        node = next(iter(view.nodes))
        return [
            Place(j.id, Allocation.single(node, self.limit, self.limit), f"profile: pinned at {self.limit:g} cores")
            for j in view.queued
        ]


class _ProgressWatch:
    """A round observer that only listens: it collects the job's progress reports, its start
    and its CPU usage samples."""

    def __init__(self, points: list[tuple[float, int, float | None]]) -> None:
        self.points = points
        self.started: float | None = None
        self.usage: list[tuple[float, float]] = []
        self.total_steps: int | None = None
        self.pid: int | None = None

    def observe(self, view: ClusterView, events: Sequence[Event]) -> list[NodeDecision]:
        for e in events:
            if isinstance(e, JobProgress):
                self.points.append((e.time, e.step, e.loss))
                total = e.metrics.get("total_steps")
                if total is not None:
                    self.total_steps = int(total)
            elif isinstance(e, JobStarted) and self.started is None:
                self.started = e.time
                self.pid = e.pid
            elif isinstance(e, JobUsage):
                self.usage.append((e.time, e.cpu_cores))
        return []


@dataclass
class ProfileRun:
    cores: float
    steps_per_s: float
    points: list[tuple[float, int, float | None]] = field(default_factory=list)
    startup_s: float | None = None
    """Process start to the first report, less the time the steps of that report took."""
    cores_used: float | None = None
    """Mean CPU the job actually got over the measured window (below the limit on a busy machine)."""
    total_steps: int | None = None
    """The job's declared length (its reports' `total_steps`)."""
    threads: int | None = None
    """Threads of the job that did the work (each within half the busiest one's CPU time)."""
    startup_cpu_s: float | None = None
    """CPU seconds the job's processes spent before training (read from their CPU times)."""


def _thread_cpu(pid: int | None) -> dict[tuple[int, int], float]:
    """CPU seconds of every thread of the process tree under `pid` (the shim and the job)."""
    import psutil

    out: dict[tuple[int, int], float] = {}
    if pid is None:
        return out
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return out
    for proc in procs:
        try:
            for t in proc.threads():
                out[(proc.pid, t.id)] = t.user_time + t.system_time
        except psutil.Error:
            continue
    return out


def _busy_threads(before: dict[tuple[int, int], float], after: dict[tuple[int, int], float]) -> int | None:
    """How many threads did the work between two samples: those within half the busiest."""
    used = [after[k] - before.get(k, 0.0) for k in after]
    top = max(used, default=0.0)
    if top <= 0:
        return None
    return sum(1 for u in used if u >= 0.5 * top)


def _run_once(spec: JobSpec, cores: float, seconds: float, home: Path) -> ProfileRun:
    from sluice.agent.cgroup import remove_root
    from sluice.engine.local import LocalEngine

    # A cgroup root of its own (removed after), as embedded planes have: a `sluice up` plane
    # running beside the profile has the same node name under the default root, and two
    # planes never share a node's cgroups (the second is refused: agent/node_owners.py).
    own_root = None if os.environ.get("SLUICE_CGROUP_ROOT") else f"sluice-profile-{os.getpid()}-{time.monotonic_ns()}"
    settings = Settings(home=home, reconcile_interval_s=0.5)
    if own_root is not None:
        settings = settings.model_copy(update={"cgroup_root": own_root})
    engine = LocalEngine(settings)
    ctl = Controller(MemoryStore(), engine, _Pin(cores), checkpoint_root=str(home / "ckpt"))
    points: list[tuple[float, int, float | None]] = []

    watch = _ProgressWatch(points)
    ctl.add_observer(watch)
    job = ctl.submit("profile", spec)

    def done() -> bool:
        rec = ctl.book.get(job.id)
        return rec is None or rec.phase.terminal

    t0 = time.monotonic()
    give_up = t0 + max(6 * seconds, 120.0)  # start-up (imports) can be slow on a busy machine
    threads_at_first: dict[tuple[int, int], float] | None = None
    steps_at_first = 0
    threads = None
    try:
        while not done() and time.monotonic() < give_up:
            ctl.step()
            if points and threads_at_first is None:
                threads_at_first = _thread_cpu(watch.pid)
                steps_at_first = points[-1][1] + 1
            # Measure `seconds` of training, counted from the first progress report.
            if points and points[-1][0] - points[0][0] >= seconds:
                break
            time.sleep(0.5)
        if threads_at_first is not None:
            threads = _busy_threads(threads_at_first, _thread_cpu(watch.pid))
        if not done():
            ctl.cancel(job.id, "profile run long enough")
            deadline = time.monotonic() + 30
            while not done() and time.monotonic() < deadline:
                ctl.step()
                time.sleep(0.2)
    finally:
        engine.close()
        if own_root is not None:
            remove_root(own_root)
    steady = points[len(points) // 4 :] if len(points) >= 8 else points
    rate = 0.0
    if len(steady) >= 2 and steady[-1][0] > steady[0][0]:
        rate = (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
    startup = None
    if watch.started is not None and points and rate > 0:
        startup = max(0.0, points[0][0] - watch.started - (points[0][1] + 1) / rate)
    used = None
    if len(steady) >= 2:
        window = [c for t, c in watch.usage if steady[0][0] <= t <= steady[-1][0]]
        used = sum(window) / len(window) if window else None
    startup_cpu = None
    if threads_at_first and used and rate > 0:
        # CPU the job's processes had used when its first report was seen, less what its
        # steps so far cost at the measured steps per core-second: the start-up's CPU work.
        startup_cpu = max(0.0, sum(threads_at_first.values()) - steps_at_first * used / rate)
    return ProfileRun(cores, max(rate, 0.0), points, startup, used, watch.total_steps, threads, startup_cpu)


def _received(run: ProfileRun) -> float:
    """Cores the job really got: its measured usage when there is one (on a busy machine it is
    below the limit), else the limit."""
    if run.cores_used is not None and run.cores_used > 0:
        return min(run.cores_used, run.cores)
    return run.cores


def curve_points(runs: Sequence[ProfileRun]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The throughput curve over the cores each run really got, not the limit it was given.

    On a shared machine a job under a 2-core limit may get 0.4 cores; its steps/s belongs at
    0.4 on the curve. Points within 0.05 cores of each other are averaged, and the curve never
    falls with more cores (measurement noise). When even the largest limit left the job
    starved (it used less than its threads could), the curve is carried on at the last
    point's steps per core-second up to the job's busy threads (one thread's speed is its
    CPU time), capped at the largest limit measured."""
    pts = sorted((_received(r), r.steps_per_s) for r in runs if r.steps_per_s > 0)
    merged: list[tuple[float, float]] = []
    for c, v in pts:
        if merged and c - merged[-1][0] < 0.05:
            pc, pv = merged[-1]
            merged[-1] = ((pc + c) / 2, (pv + v) / 2)
        else:
            merged.append((c, v))
    out: list[tuple[float, float]] = []
    for c, v in merged:
        out.append((c, max(v, out[-1][1] if out else 0.0)))
    threads = max((r.threads for r in runs if r.threads), default=None)
    top_limit = max(r.cores for r in runs)
    if out and threads is not None:
        reach = min(float(threads), top_limit)
        c, v = out[-1]
        if reach > c + 0.05:
            out.append((reach, v * reach / c))
    return tuple(c for c, _ in out), tuple(v for _, v in out)


def fit_startup(runs: Sequence[ProfileRun]) -> tuple[float, float] | None:
    """(CPU seconds, fixed seconds) of start-up, fitted as startup(c) = fixed + cpu / min(c, 1):
    one interpreter thread, so a limit below one core stretches it and one above does not.
    None without a start-up measured at two different effective shares.

    Where the runs read their start-up CPU directly (`startup_cpu_s`), that is used (median),
    and the fixed part is what the wall time left over, at the share the job got (median,
    at least 0): on a busy machine the share moves during start-up, so the fit over shares is
    the weaker estimate of the two."""
    direct = sorted(r.startup_cpu_s for r in runs if r.startup_cpu_s is not None)
    if direct:
        cpu_s = direct[len(direct) // 2]
        rest = sorted(
            r.startup_s - cpu_s / min(_received(r), 1.0) for r in runs if r.startup_s is not None and _received(r) > 0
        )
        return cpu_s, max(0.0, rest[len(rest) // 2]) if rest else 0.0
    pts = [(1.0 / min(_received(r), 1.0), r.startup_s) for r in runs if r.startup_s is not None and _received(r) > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    cpu = sum((x - mx) * (y - my) for x, y in pts) / sxx
    fixed = my - cpu * mx
    if fixed < 0:  # no fixed part: all CPU work, through the origin
        fixed, cpu = 0.0, sum(x * y for x, y in pts) / sum(x * x for x, _ in pts)
    if cpu < 0:  # start-up did not grow with less CPU: all fixed
        fixed, cpu = my, 0.0
    return max(cpu, 0.0), max(fixed, 0.0)


def fit_loss(points: list[tuple[float, int, float | None]]) -> tuple[float, float, float]:
    """(start, floor, half-loss steps) of loss(k) = floor + (start - floor) / (1 + k / half)."""
    pts = [(k, v) for _, k, v in points if v is not None]
    if len(pts) < 3:
        return 2.5, 0.2, 200.0
    start = max(v for _, v in pts[: max(1, len(pts) // 10)])
    floor = min(v for _, v in pts) * 0.9
    mid = floor + (start - floor) / 2
    half = next((float(k) for k, v in pts if v <= mid), float(pts[-1][0]))
    return start, floor, max(half, 1.0)


def profile_example(
    spec_path: str | Path, cores: tuple[float, ...] = (0.5, 1.0, 2.0), seconds: float = 20.0
) -> tuple[CpuCurve, list[ProfileRun]]:
    """Run the example once per CPU limit; return its curve and the raw runs."""
    spec = load_job_spec(spec_path)
    runs = []
    with tempfile.TemporaryDirectory(prefix="sluice-profile-") as tmp:
        for c in sorted(cores):
            runs.append(_run_once(spec, c, seconds, Path(tmp) / f"c{c:g}"))
    if all(r.steps_per_s <= 0 for r in runs):
        raise RuntimeError(f"{spec_path}: the job reported no progress; does it call sluice.sdk.report()?")
    longest = max(runs, key=lambda r: len(r.points))
    start, floor, half = fit_loss(longest.points)
    startup = fit_startup(runs)
    cores, steps = curve_points(runs)
    curve = CpuCurve(
        cores,
        steps,
        start,
        floor,
        half,
        None if startup is None else round(startup[0], 3),
        0.0 if startup is None else round(startup[1], 3),
    )
    return curve, runs


def save_profile(
    curve: CpuCurve, runs: Sequence[ProfileRun], dest: Path, source: str, seconds: float, **extra: object
) -> None:
    """Save a measured profile with the raw numbers behind it (limits, cores used, start-ups,
    threads, the job's declared length, the 1-minute load average at saving unless `extra`
    gives `load_average`), so a later reader can judge the curve."""
    from sluice.sim.cpu_profiles import save_curve

    totals = [r.total_steps for r in runs if r.total_steps is not None]
    extra.setdefault("load_average", round(os.getloadavg()[0], 2))
    save_curve(
        curve,
        dest,
        source=source,
        seconds_per_limit=seconds,
        limits=[r.cores for r in runs],
        cores_used=[r.cores_used for r in runs],
        startup_s=[r.startup_s for r in runs],
        threads=[r.threads for r in runs],
        total_steps=totals[0] if totals else None,
        **extra,
    )
