"""`sluice bench elastic`: what elastic resize buys and costs for examples/ddp.py here.

One run, side by side, on a fresh embedded control plane (local engine, two virtual nodes):

- **throughput** of ddp.py at 1, 2 and 4 replicas with the same global batch (keep_global),
  from rank 0's own clock (steps over the loop's span), with ratios against the first, and
  over the loop's second half alone (`steady_steps_s`: the warm-up left out, what the
  simulator replays, since a long job runs almost all its steps past it);
- **seconds lost per resize**: one job resized 2 → 1 → 2 by a scripted policy; for each
  resize, from the old attempt's last step to the new attempt's first — the stop, checkpoint,
  exit, relaunch, imports, rendezvous and restore together — and the stop alone (ask to exit).

A resize pays off when the time it loses is small next to the time the new size saves.

With `policy_steps` > 0 a third part runs one longer job (replicas 1..2) several ways, one
after the other on the same plane: fixed at 1 replica, fixed at 2, and under each sizing
policy (`sluice`, `pollux`, `optimus`, `tiresias`), which start it at 1 and size it from its
own measured steps/s, each by its own rule (docs/policies.md). Completion times and the
resizes each made, with their reasons (`sluice job why`), are printed side by side, and
beside each real JCT the simulator's for the same job under the same policy: a `replicas`
job (sim/replicas.py) replaying the steps/s per replica count, the start-up, the resize cost
and the end measured in the first two parts of this same run — no constant is assumed —
with sim/real per contender and their mean, and the rate each job's last attempt actually ran
at (steps over rank 0's span) against the profile's for its size: where the two disagree,
that is the gap in JCT.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from sluice.bench.scenario import embedded_plane
from sluice.control.plane import ControlPlane
from sluice.control.simulate import ReplicaProfile, SimConfig, WorkloadJob, run_simulation
from sluice.model import Allocation, Assignment, ClusterView, Decision, JobRecord, Phase, Place, Resize
from sluice.policy.registry import make_policy
from sluice.spec import parse_job_spec

DDP = Path(__file__).resolve().parents[3] / "examples" / "ddp.py"


class Sizer:
    """A scripted policy: places each queued job at `replicas` over the nodes in turn, and
    passes on the resizes the benchmark pushes. Pure, like any policy."""

    name = "bench-elastic"

    def __init__(self, replicas: int, cpu: float) -> None:
        self.replicas, self.cpu = replicas, cpu
        self._lock = threading.Lock()
        self._extra: list[Decision] = []

    def allocation(self, n: int, nodes: list[str]) -> Allocation:
        return Allocation(tuple(Assignment(nodes[k % len(nodes)], self.cpu) for k in range(n)))

    def push(self, d: Decision) -> None:
        with self._lock:
            self._extra.append(d)

    def decide(self, view: ClusterView) -> list[Decision]:
        nodes = sorted(view.nodes)
        out: list[Decision] = [
            Place(j.id, self.allocation(self.replicas, nodes), f"bench: {self.replicas} replicas") for j in view.queued
        ]
        with self._lock:
            out, self._extra = out + self._extra, []
        return out


@dataclass(frozen=True, slots=True)
class Throughput:
    replicas: int
    steps: int
    seconds: float
    steps_s: float
    samples_s: float
    """Over the whole run, the first steps' warm-up included (what the table shows)."""
    grad_noise_scale: float | None = None
    """What the job measured (sdk.GradientNoiseScale, last report): at one replica from
    consecutive batches, at more from the replicas' local gradients."""
    steady_steps_s: float = 0.0
    """Over the second half of the run only (`steady_steps_s`): what the simulator replays,
    because a long job spends almost all its time past the warm-up."""


@dataclass(frozen=True, slots=True)
class ResizeCost:
    change: str
    lost_s: float
    """From the old attempt's last step to the new attempt's first."""
    stop_s: float
    """From the stop request to the exit (the controller's `last_stop_s`)."""


@dataclass(frozen=True, slots=True)
class PolicyRun:
    how: str
    jct_s: float
    """Submit to finish, as the job book records them."""
    attempts: int
    resizes: tuple[str, ...]
    """Each resize the policy made, with its reason (`sluice job why`)."""
    sim_jct_s: float | None = None
    """The simulator's JCT for the same job and policy, from this run's measurements."""
    sim_attempts: int | None = None
    world: int = 0
    """Replicas of the job's last attempt."""
    steady_steps_s: float = 0.0
    """The last attempt's second-half rate (rank 0's marks, as the profile's are taken)."""
    span_steps_s: float = 0.0
    """The last attempt's steps over rank 0's whole span: the rate its JCT was made of (the
    warm-up is a fraction of a second in a job of a minute or more), to check the profile
    against: sim/real JCT ≈ this / the profile's rate when neither resized and the start-up
    and end are small next to the run."""


CONTENDERS = ("fixed 1", "fixed 2", "sluice", "pollux", "optimus", "tiresias")
"""How the policy part runs the job: fixed sizes (a scripted placement), then each policy."""


@dataclass(frozen=True, slots=True)
class Overheads:
    """Times around the steps of one run, from the job book and rank 0's clock (both wall time)."""

    replicas: int
    start_s: float
    """Submit to the first step."""
    end_s: float
    """Last step to the recorded end."""


def _job(plane: ControlPlane, job_id: str) -> JobRecord:
    return plane.get_job(plane.store.get_tenant("default"), job_id)  # type: ignore[arg-type]


def wait_job(plane: ControlPlane, job_id: str, ok: Any, timeout: float, what: str) -> JobRecord:
    """Poll the job book until `ok(job)`; a job that ends first, or a timeout, raises with `what`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = _job(plane, job_id)
        if ok(job):
            return job
        if job.phase.terminal:
            raise RuntimeError(f"job {job_id} ended {job.phase} while waiting for {what}: {job.reason}")
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id}: no {what} within {timeout:g}s")


def submit_ddp(plane: ControlPlane, stats: Path, steps: int, width: int, batch: int, cpu: float, most: int) -> str:
    """Submit examples/ddp.py as the default tenant (replicas 1..`most`, keep_global batch),
    its per-attempt, per-rank stats files in `stats`; checkpoints only on a resize's stop."""
    raw = {
        "name": "bench-elastic",
        "command": ["python", str(DDP), "--steps", str(steps), "--width", str(width), "--batch", str(batch)],
        "workdir": str(DDP.parent),
        "resources": {"cpu": {"min": cpu}, "replicas": {"min": 1, "max": most, "global_batch": batch}},
        "checkpoint": {"interval_s": 3600},  # only the resizes' stops save
        "max_restarts": 0,
    }
    raw["command"] += ["--stats", str(stats / "a{attempt}-r{rank}.json")]  # type: ignore[operator]
    return plane.submit(plane.store.get_tenant("default"), parse_job_spec(raw)).id  # type: ignore[arg-type]


def steady_steps_s(marks: list[tuple[int, float]] | list[list[float]]) -> float:
    """Steps per second over the second half of a run, from ddp.py's `marks` ((step, wall
    clock) every ~1/200 of the run, the last step included).

    The first steps of a PyTorch job are slow (allocator, DDP's first bucket rebuild, cold
    caches); in a run of a few seconds they pull the whole-run rate well below what the
    same job does for the rest of a long run (measured here: 347 steps/s over 600 steps
    against ~500 steady). The simulator replays long jobs, so it gets the steady rate.
    0.0 when there are too few marks to tell.
    """
    if len(marks) < 4:
        return 0.0
    (s0, t0), (s1, t1) = marks[len(marks) // 2], marks[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else 0.0


def throughput(replicas: int, stats: dict[str, Any], batch: int) -> Throughput:
    """One measuring run's throughput from rank 0's stats file: over the whole loop (the
    table's steps/s) and over its second half (`steady_steps_s`, what the simulator gets;
    the whole-loop rate stands in only when the run left too few marks)."""
    done, secs = stats["last"] - stats["start"] + 1, max(1e-9, stats["t_end"] - stats["t_first"])
    gns = stats.get("metrics", {}).get("grad_noise_scale")
    steady = steady_steps_s(stats.get("marks", [])) or done / secs
    return Throughput(replicas, done, secs, done / secs, done * batch / secs, gns, steady)


def _stats(folder: Path, attempt: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / f"a{attempt}-r0.json").read_text())
    return data


def run(
    replicas: tuple[int, ...] = (1, 2, 4),
    steps: int = 1500,
    width: int = 256,
    batch: int = 128,
    timeout_s: float = 600.0,
    out: Path | None = None,
    console: Console | None = None,
    policy_steps: int = 0,
    contenders: tuple[str, ...] = CONTENDERS,
) -> tuple[list[Throughput], list[ResizeCost]]:
    console = console or Console()
    most = max(*replicas, 2)
    cores = len(psutil.Process().cpu_affinity() or []) or psutil.cpu_count() or 1
    cpu = max(0.1, round(cores / most, 2))  # all replicas fit at the largest size
    rates: list[Throughput] = []
    costs: list[ResizeCost] = []
    runs: list[PolicyRun] = []
    around: list[Overheads] = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-elastic-") as tmp:
        # No datasets here: the node cache's memory tier goes with the run, not into /dev/shm.
        os.environ.setdefault("SLUICE_CACHE_MEMORY_DIR", str(Path(tmp) / "memory-tier"))
        opts = {"virtual_nodes": 2, "reconcile_interval_s": 0.1, "stop_grace_s": 20.0}
        with embedded_plane(Path(tmp) / "home", "kube", **opts) as plane:
            for n in replicas:
                console.print(f"ddp.py at {n} replica(s), {steps} steps ...")
                folder = Path(tmp) / f"r{n}"
                folder.mkdir()
                with plane.controller.lock:
                    plane.controller.policy = Sizer(n, cpu)
                job_id = submit_ddp(plane, folder, steps, width, batch, cpu, most)
                job = wait_job(plane, job_id, lambda j: j.phase.terminal, timeout_s, "the end")
                if job.phase != Phase.SUCCEEDED:
                    raise RuntimeError(f"ddp.py at {n} replicas ended {job.phase}: {job.reason}")
                s = _stats(folder, 1)
                rates.append(throughput(n, s, batch))
                assert job.finished_at is not None
                around.append(Overheads(n, s["t_first"] - job.submitted_at, job.finished_at - s["t_end"]))
            console.print("ddp.py resized 2 → 1 → 2 ...")
            folder = Path(tmp) / "resize"
            folder.mkdir()
            sizer = Sizer(2, cpu)
            with plane.controller.lock:
                plane.controller.policy = sizer
            job_id = submit_ddp(plane, folder, steps, width, batch, cpu, most)
            for attempt, to in ((1, 1), (2, 2)):
                third = steps // 3 * attempt
                wait_job(
                    plane, job_id, lambda j, a=attempt, t=third: j.attempt == a and j.step >= t, timeout_s, "steps"
                )
                sizer.push(Resize(job_id, sizer.allocation(to, sorted(plane.controller.node_names())), "bench"))
                job = wait_job(plane, job_id, lambda j, a=attempt: j.attempt > a, timeout_s, "the relaunch")
                costs.append(ResizeCost(f"{3 - to} → {to}", 0.0, job.last_stop_s or 0.0))
            job = wait_job(plane, job_id, lambda j: j.phase.terminal, timeout_s, "the end")
            if job.phase != Phase.SUCCEEDED:
                raise RuntimeError(f"the resized job ended {job.phase}: {job.reason}")
            for i, cost in enumerate(costs):
                lost = _stats(folder, i + 2)["t_first"] - _stats(folder, i + 1)["t_end"]
                costs[i] = ResizeCost(cost.change, lost, cost.stop_s)
            profile = measured_profile(rates, costs, around)
            if policy_steps > 0:
                runs = _policies(plane, Path(tmp), policy_steps, width, batch, cpu, timeout_s, console, contenders)
                runs = [simulate(r, profile, policy_steps, cpu, cores) for r in runs]
    print_report(rates, costs, steps, width, batch, cpu, console)
    starts = ", ".join(f"{n}: {t:.1f}s" for n, t in zip(profile.replicas, profile.start_s, strict=True))
    console.print(
        f"simulator profile from these runs: start-up {starts}; resize {profile.resize_s:.1f}s; "
        f"end {profile.end_s:.1f}s",
        markup=False,
    )
    if runs:
        print_policies(runs, policy_steps, console, profile)
    if out is not None:
        out.write_text(
            json.dumps(
                {
                    "throughput": [asdict(r) for r in rates],
                    "resize": [asdict(c) for c in costs],
                    "policies": [asdict(r) for r in runs],
                    "profile": asdict(profile),
                    "load_avg": os.getloadavg(),
                }
            )
        )
    return rates, costs


def _contender(how: str, cpu: float) -> Any:
    """The policy a contender runs under: a scripted fixed size, or a policy by name."""
    if how.startswith("fixed "):
        return Sizer(int(how.split()[1]), cpu)
    return make_policy(how)


def _policies(
    plane: ControlPlane,
    tmp: Path,
    steps: int,
    width: int,
    batch: int,
    cpu: float,
    timeout_s: float,
    console: Console,
    contenders: tuple[str, ...] = CONTENDERS,
) -> list[PolicyRun]:
    """The same job fixed at 1 and at 2 replicas, then sized by each policy from its measurements."""
    out: list[PolicyRun] = []
    caller = plane.store.get_tenant("default")
    for how in contenders:
        console.print(f"ddp.py, {steps} steps, replicas 1..2: {how} ...")
        folder = tmp / f"policy-{how.replace(' ', '')}"
        folder.mkdir()
        with plane.controller.lock:
            plane.controller.policy = _contender(how, cpu)
        job_id = submit_ddp(plane, folder, steps, width, batch, cpu, 2)
        job = wait_job(plane, job_id, lambda j: j.phase.terminal, timeout_s * 4, "the end")
        if job.phase != Phase.SUCCEEDED:
            raise RuntimeError(f"ddp.py ({how}) ended {job.phase}: {job.reason}")
        resized = tuple(e.message for e in plane.why(caller, job_id) if "resized" in e.message)  # type: ignore[arg-type]
        assert job.finished_at is not None
        last = _stats(folder, job.attempt)
        run = PolicyRun(how, job.finished_at - job.submitted_at, job.attempt, resized)
        span = (last["last"] - last["start"] + 1) / max(1e-9, last["t_end"] - last["t_first"])
        steady = steady_steps_s(last.get("marks", []))
        out.append(replace(run, world=int(last["world"]), steady_steps_s=steady, span_steps_s=span))
    return out


def measured_profile(rates: list[Throughput], costs: list[ResizeCost], around: list[Overheads]) -> ReplicaProfile:
    """What the simulator replays, all from this run: steady steps/s per replica count (rank
    0's clock, second half of each run: `steady_steps_s`), submit → first step per count,
    the mean seconds lost per resize, the mean last step → recorded end."""
    by = {r.replicas: r for r in rates}
    starts = {o.replicas: o.start_s for o in around}
    counts = tuple(sorted(by))
    return ReplicaProfile(
        counts,
        tuple(by[n].steady_steps_s or by[n].steps_s for n in counts),
        tuple(max(0.0, starts[n]) for n in counts),
        max(0.0, sum(c.lost_s for c in costs) / len(costs)) if costs else 0.0,
        max(0.0, sum(o.end_s for o in around) / len(around)) if around else 0.0,
    )


def simulate(run: PolicyRun, profile: ReplicaProfile, steps: int, cpu: float, cores: int) -> PolicyRun:
    """The same job under the same policy in the simulator: two nodes of half the cores each
    (as the plane's two virtual nodes), rounds of 1 s of virtual time."""
    job = WorkloadJob(
        "bench-elastic",
        0.0,
        "replicas",
        cpu_steps=steps,
        cpus=cpu,
        replicas_min=1,
        replicas_max=2,
        replica_profile=profile,
    )
    cfg = SimConfig(nodes=2, gpus_per_node=0, cpus_per_node=cores / 2, interval_s=1.0, max_time_s=100 * run.jct_s)
    res = run_simulation([job], _contender(run.how, cpu), cfg)
    r = res.jobs[0]
    return replace(run, sim_jct_s=r.jct_s, sim_attempts=r.restarts + 1)


def print_policies(runs: list[PolicyRun], steps: int, console: Console, profile: ReplicaProfile) -> None:
    base = runs[0]
    t = Table(title=f"one job of {steps} steps, replicas 1..2: real JCT vs the simulator's for the same job")
    cols = ("how", "real JCT (s)", "vs " + base.how, "attempts", "sim JCT (s)", "sim/real", "sim attempts")
    for col in (*cols, "last attempt: replicas", "its steps/s", "its / profile's"):
        t.add_column(col, justify="right")
    rates = dict(zip(profile.replicas, profile.steps_per_s, strict=True))
    for r in runs:
        sim = "-" if r.sim_jct_s is None else f"{r.sim_jct_s:.1f}"
        ratio = "-" if r.sim_jct_s is None else f"{r.sim_jct_s / r.jct_s:.2f}"
        vs = f"{r.span_steps_s / rates[r.world]:.2f}" if r.world in rates and r.span_steps_s else "-"
        t.add_row(
            r.how,
            f"{r.jct_s:.1f}",
            f"{r.jct_s / base.jct_s:.2f}",
            str(r.attempts),
            sim,
            ratio,
            str(r.sim_attempts or "-"),
            str(r.world or "-"),
            f"{r.span_steps_s:.1f}" if r.span_steps_s else "-",
            vs,
        )
    console.print(t)
    paired = [r.sim_jct_s / r.jct_s for r in runs if r.sim_jct_s is not None]
    if paired:
        console.print(
            f"  sim/real JCT: mean {sum(paired) / len(paired):.2f}, range {min(paired):.2f}–{max(paired):.2f}; "
            "its steps/s: the last attempt's steps over rank 0's span (its / profile's < 1: the simulator ran "
            "that size faster than this job did, and sim/real is low by about as much)",
            markup=False,
        )
    for r in runs:
        for m in r.resizes:
            console.print(f"  {r.how}: {m}", markup=False)
    still = [r.how for r in runs if not r.how.startswith("fixed") and r.attempts == 1]
    if still:
        console.print(
            f"  did not resize in the real run: {', '.join(still)} (tiresias never does; the others only when "
            "the learned gain of another size pays for the resize their rule counts: too short a run shows no "
            "exploration — raise --policy-steps)",
            markup=False,
        )


def print_report(
    rates: list[Throughput], costs: list[ResizeCost], steps: int, width: int, batch: int, cpu: float, console: Console
) -> None:
    console.print(
        f"machine: {platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}; "
        f"ddp.py --width {width}, global batch {batch} (keep_global), {cpu:g} CPU request per replica"
    )
    base = rates[0]
    table = Table(title=f"throughput at the same global batch (ratios vs {base.replicas} replica(s))")
    cols = ("replicas", "steps", "seconds", "steps/s", "samples/s", "ratio", "steady steps/s", "ratio", "B_noise")
    for col in cols:
        table.add_column(col, justify="right")
    for r in rates:
        ratio = f"{r.steps_s / base.steps_s:.2f}"
        steady = f"{r.steady_steps_s / base.steady_steps_s:.2f}" if base.steady_steps_s else "-"
        gns = "-" if r.grad_noise_scale is None else f"{r.grad_noise_scale:.0f}"
        table.add_row(
            str(r.replicas),
            str(r.steps),
            f"{r.seconds:.1f}",
            f"{r.steps_s:.1f}",
            f"{r.samples_s:.0f}",
            ratio,
            f"{r.steady_steps_s:.1f}",
            steady,
            gns,
        )
    console.print(table)
    by_size = {r.replicas: r for r in rates}
    lost = Table(title="seconds lost per resize (last step of the old attempt → first step of the new)")
    for col in ("resize", "lost (s)", "of which the stop (s)", "steps it would have run"):
        lost.add_column(col, justify="right")
    for c in costs:
        old = by_size.get(int(c.change.split()[0]))
        would = "-" if old is None else f"{c.lost_s * old.steps_s:.0f}"
        lost.add_row(c.change, f"{c.lost_s:.2f}", f"{c.stop_s:.2f}", would)
    console.print(lost)
