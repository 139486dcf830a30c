"""Run a workload of real jobs on an embedded control plane and measure it.

Shared by `sluice demo` (which draws it live) and `sluice bench local` (which runs it once
per policy and compares). The control plane runs in this process — reconcile thread, local
engine and node agents — so its own CPU use is this process's CPU time; the jobs are
separate processes and are not counted.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from sluice.agent.cgroup import remove_root
from sluice.control.plane import ControlPlane
from sluice.model import JobRecord, Phase
from sluice.settings import Settings
from sluice.spec import JobSpec, load_job_spec

EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "examples"


@dataclass(frozen=True)
class Arrival:
    """One job of a workload: submit `spec` `at_s` seconds after the workload starts."""

    at_s: float
    spec: JobSpec


@dataclass
class JobOutcome:
    id: str
    name: str
    phase: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    restarts: int
    steps: int
    loss: float | None
    reason: str

    @property
    def jct_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.submitted_at

    @property
    def submit_to_running_s(self) -> float | None:
        return None if self.started_at is None else self.started_at - self.submitted_at


@dataclass
class RunResult:
    policy: str
    jobs: list[JobOutcome]
    wall_s: float
    control_cpu_s: float
    busy_cpu_s: float = 0.0
    busy_wall_s: float = 0.0
    """Control-plane CPU and wall time while at least `busy_threshold` jobs were running."""
    busy_threshold: int = 6
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return all(j.phase == Phase.SUCCEEDED for j in self.jobs)

    @property
    def avg_jct_s(self) -> float:
        jcts = [j.jct_s for j in self.jobs if j.jct_s is not None]
        return sum(jcts) / len(jcts) if jcts else float("nan")

    @property
    def makespan_s(self) -> float:
        ends = [j.finished_at for j in self.jobs if j.finished_at is not None]
        starts = [j.submitted_at for j in self.jobs]
        return max(ends) - min(starts) if ends and starts else float("nan")

    @property
    def control_cpu_percent(self) -> float:
        return 100.0 * self.control_cpu_s / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def busy_cpu_percent(self) -> float | None:
        return 100.0 * self.busy_cpu_s / self.busy_wall_s if self.busy_wall_s > 1 else None

    @property
    def mean_submit_to_running_s(self) -> float:
        xs = [j.submit_to_running_s for j in self.jobs if j.submit_to_running_s is not None]
        return sum(xs) / len(xs) if xs else float("nan")

    @property
    def max_submit_to_running_s(self) -> float:
        """Only jobs that found room at once count: a job that had to queue measures the queue."""
        xs = [j.submit_to_running_s for j in self.jobs if j.submit_to_running_s is not None]
        return max(xs) if xs else float("nan")


def example_spec(example: str, **changes: object) -> JobSpec:
    """An example's YAML spec, optionally with fields changed (e.g. a different name)."""
    spec = load_job_spec(EXAMPLES_DIR / f"{example}.yaml")
    if changes:
        spec = JobSpec.model_validate({**spec.model_dump(), **changes})
    return spec


def mixed_workload(stagger_s: float = 10.0, scale: float = 1.0) -> list[Arrival]:
    """The mixed workload of `sluice bench local` and `sluice demo`: six example jobs of four
    model families arriving `stagger_s` apart — more demand than two cores can serve.

    Each job asks for a quarter of a core (request) and may use up to two (limit), so all six
    are admitted at once on two cores and the policy decides how the cores are shared.
    """
    order = ["mlp", "cnn", "lstm", "autoencoder", "mlp", "cnn"]
    out = []
    for i, name in enumerate(order):
        env = {"EXAMPLE_SEED": str(i)}
        if scale != 1.0:
            env["EXAMPLE_SCALE"] = f"{scale:g}"
        spec = example_spec(
            name,
            name=f"{name}-{i}",
            env=env,
            resources={"cpu": {"min": 0.25, "max": 2.0}},
        )
        out.append(Arrival(i * stagger_s, spec))
    return out


def _result(job: JobRecord) -> JobOutcome:
    return JobOutcome(
        job.id,
        job.spec.name,
        str(job.phase),
        job.submitted_at,
        job.started_at,
        job.finished_at,
        job.restarts,
        job.step,
        job.loss,
        job.reason,
    )


_PLANE_COUNT = itertools.count()
"""Numbers the embedded planes of one process, so each gets its own cgroup root."""

Tick = Callable[[ControlPlane, list[JobRecord], float], None]


@contextlib.contextmanager
def embedded_plane(home: Path, policy: str, **overrides: object) -> Iterator[ControlPlane]:
    """A control plane on its own fresh home, with the local engine; stopped (and its jobs
    cancelled) on exit. One tenant runs its own jobs here (the demo, benchmarks), so they run
    as the caller's user (isolation off: nothing to isolate from, and the caller's interpreter
    works as is) unless SLUICE_ISOLATION or `isolation=` says otherwise.

    Its jobs' and nodes' cgroups go under a root of its own (`sluice-embedded-<pid>-<n>`,
    removed on exit) unless SLUICE_CGROUP_ROOT or `cgroup_root=` names one: two embedded
    planes running at once (a benchmark beside a test) would otherwise share
    `sluice/node-0`, each reading the other's jobs as its own node's load."""
    if "SLUICE_ISOLATION" not in os.environ:
        overrides.setdefault("isolation", "off")
    own_root = None
    if "SLUICE_CGROUP_ROOT" not in os.environ and "cgroup_root" not in overrides:
        own_root = f"sluice-embedded-{os.getpid()}-{next(_PLANE_COUNT)}"
        overrides["cgroup_root"] = own_root
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    settings = Settings(home=home, policy=policy, **overrides)  # type: ignore[arg-type]
    plane = ControlPlane.from_settings(settings)
    plane.bootstrap_tenants()
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        # `kill`/`timeout` send SIGTERM: unwind like Ctrl-C so the jobs below are cancelled.
        signal.signal(signal.SIGTERM, _raise_interrupt)
    plane.start()
    try:
        yield plane
    finally:
        _cancel_all(plane, wait_s=settings.stop_grace_s + 5)
        plane.stop()
        if own_root is not None:
            remove_root(own_root)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _cancel_all(plane: ControlPlane, wait_s: float) -> None:
    """Cancel every unfinished job and wait until their processes are gone (the reconcile
    thread is still running and sees the exits); an embedded plane leaves nothing behind."""
    with contextlib.suppress(Exception):
        admin = next(t for t in plane.store.list_tenants() if t.admin)
        for j in plane.list_jobs(admin):
            if not j.phase.terminal:
                plane.cancel(admin, j.id)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(not j.phase.terminal for j in plane.list_jobs(admin)):
            time.sleep(0.2)
        for j in plane.list_jobs(admin):  # still there after the grace: kill, leave nothing behind
            if not j.phase.terminal:
                plane.engine.stop(j.id, j.attempt, checkpoint=False)
        time.sleep(0.5)
        plane.step()


def run_workload(
    plane: ControlPlane,
    arrivals: list[Arrival],
    *,
    tenant: str = "default",
    timeout_s: float = 1800.0,
    on_tick: Tick | None = None,
    tick_s: float = 0.5,
    busy_threshold: int = 6,
) -> RunResult:
    """Submit each arrival at its time, wait until every job has ended, and measure."""
    caller = plane.store.get_tenant(tenant)
    if caller is None:
        raise ValueError(f"tenant {tenant!r} does not exist")
    me = psutil.Process(os.getpid())
    cpu0 = sum(me.cpu_times()[:2])
    t0 = time.monotonic()
    pending = sorted(arrivals, key=lambda a: a.at_s)
    ids: list[str] = []
    busy_cpu = busy_wall = 0.0
    last_cpu, last_t = cpu0, t0
    while True:
        now = time.monotonic() - t0
        while pending and pending[0].at_s <= now:
            ids.append(plane.submit(caller, pending.pop(0).spec).id)
        jobs = [plane.get_job(caller, i) for i in ids]
        cpu, t = sum(me.cpu_times()[:2]), time.monotonic()
        if sum(1 for j in jobs if j.phase == Phase.RUNNING) >= busy_threshold:
            busy_cpu += cpu - last_cpu
            busy_wall += t - last_t
        last_cpu, last_t = cpu, t
        if on_tick is not None:
            on_tick(plane, jobs, now)
        if not pending and jobs and all(j.phase.terminal for j in jobs):
            break
        if now > timeout_s:
            raise TimeoutError(f"workload did not finish in {timeout_s:g}s")
        time.sleep(tick_s)
    wall = time.monotonic() - t0
    return RunResult(
        policy=plane.controller.policy.name,
        jobs=[_result(plane.get_job(caller, i)) for i in ids],
        wall_s=wall,
        control_cpu_s=sum(me.cpu_times()[:2]) - cpu0,
        busy_cpu_s=busy_cpu,
        busy_wall_s=busy_wall,
        busy_threshold=busy_threshold,
    )
