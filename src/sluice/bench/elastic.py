"""`sluice bench elastic`: what elastic resize buys and costs for examples/ddp.py here.

One run, side by side, on a fresh embedded control plane (local engine, two virtual nodes):

- **throughput** of ddp.py at 1, 2 and 4 replicas with the same global batch (keep_global),
  from rank 0's own clock (steps over the loop's span), with ratios against the first;
- **seconds lost per resize**: one job resized 2 → 1 → 2 by a scripted policy; for each
  resize, from the old attempt's last step to the new attempt's first — the stop, checkpoint,
  exit, relaunch, imports, rendezvous and restore together — and the stop alone (ask to exit).

A resize pays off when the time it loses is small next to the time the new size saves.

With `policy_steps` > 0 a third part runs one longer job (replicas 1..2) three ways, one
after the other on the same plane: fixed at 1 replica, fixed at 2, and under the `sluice`
policy, which starts it at 1 and sizes it from its own measured steps/s (learned curve,
exploration bound, resize cost counted: docs/policies.md). Completion times and the
resizes `sluice` made, with their reasons, are printed side by side.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from sluice.bench.scenario import embedded_plane
from sluice.control.plane import ControlPlane
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
    grad_noise_scale: float | None = None
    """What the job measured (sdk.GradientNoiseScale, last report): at one replica from
    consecutive batches, at more from the replicas' local gradients."""


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


def _job(plane: ControlPlane, job_id: str) -> JobRecord:
    return plane.get_job(plane.store.get_tenant("default"), job_id)  # type: ignore[arg-type]


def _wait(plane: ControlPlane, job_id: str, ok: Any, timeout: float, what: str) -> JobRecord:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = _job(plane, job_id)
        if ok(job):
            return job
        if job.phase.terminal:
            raise RuntimeError(f"job {job_id} ended {job.phase} while waiting for {what}: {job.reason}")
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id}: no {what} within {timeout:g}s")


def _submit(plane: ControlPlane, stats: Path, steps: int, width: int, batch: int, cpu: float, most: int) -> str:
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


def _stats(folder: Path, attempt: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / f"a{attempt}-r0.json").read_text())
    return data


def run(
    replicas: tuple[int, ...] = (1, 2, 4),
    steps: int = 600,
    width: int = 256,
    batch: int = 128,
    timeout_s: float = 600.0,
    out: Path | None = None,
    console: Console | None = None,
    policy_steps: int = 0,
) -> tuple[list[Throughput], list[ResizeCost]]:
    console = console or Console()
    most = max(*replicas, 2)
    cores = len(psutil.Process().cpu_affinity() or []) or psutil.cpu_count() or 1
    cpu = max(0.1, round(cores / most, 2))  # all replicas fit at the largest size
    rates: list[Throughput] = []
    costs: list[ResizeCost] = []
    runs: list[PolicyRun] = []
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
                job_id = _submit(plane, folder, steps, width, batch, cpu, most)
                job = _wait(plane, job_id, lambda j: j.phase.terminal, timeout_s, "the end")
                if job.phase != Phase.SUCCEEDED:
                    raise RuntimeError(f"ddp.py at {n} replicas ended {job.phase}: {job.reason}")
                s = _stats(folder, 1)
                done, secs = s["last"] - s["start"] + 1, s["t_end"] - s["t_first"]
                gns = s.get("metrics", {}).get("grad_noise_scale")
                rates.append(Throughput(n, done, secs, done / secs, done * batch / secs, gns))
            console.print("ddp.py resized 2 → 1 → 2 ...")
            folder = Path(tmp) / "resize"
            folder.mkdir()
            sizer = Sizer(2, cpu)
            with plane.controller.lock:
                plane.controller.policy = sizer
            job_id = _submit(plane, folder, steps, width, batch, cpu, most)
            for attempt, to in ((1, 1), (2, 2)):
                third = steps // 3 * attempt
                _wait(plane, job_id, lambda j, a=attempt, t=third: j.attempt == a and j.step >= t, timeout_s, "steps")
                sizer.push(Resize(job_id, sizer.allocation(to, sorted(plane.controller.node_names())), "bench"))
                job = _wait(plane, job_id, lambda j, a=attempt: j.attempt > a, timeout_s, "the relaunch")
                costs.append(ResizeCost(f"{3 - to} → {to}", 0.0, job.last_stop_s or 0.0))
            job = _wait(plane, job_id, lambda j: j.phase.terminal, timeout_s, "the end")
            if job.phase != Phase.SUCCEEDED:
                raise RuntimeError(f"the resized job ended {job.phase}: {job.reason}")
            for i, cost in enumerate(costs):
                lost = _stats(folder, i + 2)["t_first"] - _stats(folder, i + 1)["t_end"]
                costs[i] = ResizeCost(cost.change, lost, cost.stop_s)
            if policy_steps > 0:
                runs = _policies(plane, Path(tmp), policy_steps, width, batch, cpu, timeout_s, console)
    print_report(rates, costs, steps, width, batch, cpu, console)
    if runs:
        print_policies(runs, policy_steps, console)
    if out is not None:
        out.write_text(
            json.dumps(
                {
                    "throughput": [asdict(r) for r in rates],
                    "resize": [asdict(c) for c in costs],
                    "policies": [asdict(r) for r in runs],
                }
            )
        )
    return rates, costs


def _policies(
    plane: ControlPlane, tmp: Path, steps: int, width: int, batch: int, cpu: float, timeout_s: float, console: Console
) -> list[PolicyRun]:
    """The same job fixed at 1 and at 2 replicas, then sized by `sluice` from its measurements."""
    out: list[PolicyRun] = []
    caller = plane.store.get_tenant("default")
    for how in ("fixed 1", "fixed 2", "sluice"):
        console.print(f"ddp.py, {steps} steps, replicas 1..2: {how} ...")
        folder = tmp / f"policy-{how.replace(' ', '')}"
        folder.mkdir()
        with plane.controller.lock:
            plane.controller.policy = make_policy("sluice") if how == "sluice" else Sizer(int(how[-1]), cpu)
        job_id = _submit(plane, folder, steps, width, batch, cpu, 2)
        job = _wait(plane, job_id, lambda j: j.phase.terminal, timeout_s * 4, "the end")
        if job.phase != Phase.SUCCEEDED:
            raise RuntimeError(f"ddp.py ({how}) ended {job.phase}: {job.reason}")
        resized = tuple(e.message for e in plane.why(caller, job_id) if "resized" in e.message)  # type: ignore[arg-type]
        assert job.finished_at is not None
        out.append(PolicyRun(how, job.finished_at - job.submitted_at, job.attempt, resized))
    return out


def print_policies(runs: list[PolicyRun], steps: int, console: Console) -> None:
    base = runs[0]
    t = Table(title=f"one job of {steps} steps, replicas 1..2: fixed sizes vs sizing from measured speed")
    for col in ("how", "JCT (s)", "ratio", "attempts"):
        t.add_column(col, justify="right")
    for r in runs:
        t.add_row(r.how, f"{r.jct_s:.1f}", f"{r.jct_s / base.jct_s:.2f}", str(r.attempts))
    console.print(t)
    for r in runs:
        for m in r.resizes:
            console.print(f"  {r.how}: {m}", markup=False)


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
    for col in ("replicas", "steps", "seconds", "steps/s", "samples/s", "ratio", "B_noise (job's)"):
        table.add_column(col, justify="right")
    for r in rates:
        ratio = f"{r.steps_s / base.steps_s:.2f}"
        gns = "-" if r.grad_noise_scale is None else f"{r.grad_noise_scale:.0f}"
        table.add_row(
            str(r.replicas), str(r.steps), f"{r.seconds:.1f}", f"{r.steps_s:.1f}", f"{r.samples_s:.0f}", ratio, gns
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
