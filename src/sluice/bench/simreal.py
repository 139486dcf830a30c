"""`sluice bench simreal`: the mixed workload of `sluice bench local`, run for real and in the
simulator, side by side, to check the simulator against the machine it claims to model.

1. Profiles: each distinct example of the workload is measured by `sluice sim profile`'s
   profiler (steps/s at several real CFS limits, start-up time), or a profile saved by an
   earlier run is reused.
2. The sim workload is built from the real one: the same arrivals, job names, CPU requests
   and limits, and step counts (the example's declared length times the workload's scale).
3. Each policy runs the real workload on a fresh embedded control plane (local engine), then
   the sim workload on one node with the real node's cores, less the cores other processes on
   this machine took during the real run (measured, not assumed: the machine may be shared).
   The simulator rounds at the plane's reconcile interval; the policy keeps its own interval,
   as on the plane.

Policies see the same signals in both: progress reports, usage and restarts; the simulator
uses its profiles only to move the jobs, never to inform a policy.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from sluice.bench.local import as_dict
from sluice.bench.scenario import EXAMPLES_DIR, Arrival, RunResult, embedded_plane, mixed_workload, run_workload
from sluice.control.plane import ControlPlane
from sluice.control.simulate import SimConfig, SimResult, WorkloadJob, run_simulation
from sluice.model import JobRecord, Phase

PROFILE_CORES = (0.25, 0.5, 1.0, 2.0)
"""CPU limits each example is profiled at: below, at and above the one core a one-thread job can use."""


def example_of(arrival: Arrival) -> str:
    """The example an arrival runs (`python mlp.py` -> `mlp`)."""
    script = next((a for a in arrival.spec.command if a.endswith(".py")), None)
    if script is None:
        raise ValueError(f"{arrival.spec.name}: not an example script run ({arrival.spec.command})")
    return Path(script).stem


def ensure_profiles(
    examples: list[str],
    directory: Path,
    *,
    cores: tuple[float, ...] = PROFILE_CORES,
    seconds: float = 10.0,
    refresh: bool = False,
    console: Console | None = None,
) -> dict[str, Path]:
    """A saved profile per example: reused when present (unless `refresh`), else measured now."""
    from sluice.control.profile import profile_example, save_profile

    directory.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for ex in dict.fromkeys(examples):
        dest = directory / f"{ex}.profile.json"
        if refresh or not dest.is_file():
            if console is not None:
                console.print(f"profiling {ex} at {', '.join(f'{c:g}' for c in cores)} cores ({seconds:g} s each) ...")
            curve, runs = profile_example(EXAMPLES_DIR / f"{ex}.yaml", cores, seconds)
            save_profile(curve, runs, dest, f"examples/{ex}.yaml", seconds)
        out[ex] = dest
    return out


def declared_steps(example: str, profile: Path | None = None) -> int:
    """The example's default length (scale 1): the `total_steps` its reports declared while
    it was profiled, else the `default_steps=` in its script."""
    if profile is not None and profile.is_file():
        total = json.loads(profile.read_text()).get("total_steps")
        if total:
            return int(total)
    m = re.search(r"default_steps=([\d_]+)", (EXAMPLES_DIR / f"{example}.py").read_text())
    if m is None:
        raise ValueError(f"examples/{example}.py declares no default_steps")
    return int(m.group(1).replace("_", ""))


def job_steps(arrival: Arrival, default: int) -> int:
    """Steps the real job runs: the examples' `steps_from_cli` rule (EXAMPLE_SCALE in its env)."""
    scale = float(arrival.spec.env.get("EXAMPLE_SCALE") or os.environ.get("SLUICE_EXAMPLE_SCALE", "1"))
    return max(1, math.ceil(default * scale))


def sim_workload(arrivals: list[Arrival], profiles: dict[str, Path]) -> list[WorkloadJob]:
    """The simulator's twin of a real workload: same names, arrivals, CPU request and limit,
    and steps; each job moves along its example's measured profile."""
    out = []
    for a in arrivals:
        ex = example_of(a)
        cpu = a.spec.resources.cpu
        out.append(
            WorkloadJob(
                name=a.spec.name,
                submit_time=a.at_s,
                kind="cpu",
                gpus=0,
                cpu_profile=str(profiles[ex]),
                cpu_steps=job_steps(a, declared_steps(ex, profiles.get(ex))),
                cpus=cpu.min,
                cpu_max=cpu.max,
            )
        )
    return out


@dataclass
class Background:
    """CPU taken on this machine by processes outside the workload, sampled while it ran."""

    samples: list[float] = field(default_factory=list)
    timeline: list[tuple[float, int, float, float]] = field(default_factory=list)
    """(seconds into the run, jobs running, cores the workload used, cores others used) per tick."""
    _last: tuple[float, float, float] | None = None
    _seen: dict[int, float] = field(default_factory=dict)
    _script: dict[int, str] = field(default_factory=dict)

    def cpu_by_script(self) -> dict[str, float]:
        """CPU seconds per example script run (`mlp.py`: both mlp jobs), the rest as `other`
        (the shims); with the steps each job ran, what a step really cost in this run."""
        out: dict[str, float] = {}
        for pid, cpu in self._seen.items():
            name = self._script.get(pid, "other")
            out[name] = out.get(name, 0.0) + cpu
        return out

    def _ours(self) -> float:
        """CPU seconds of this process and its descendants (the plane, the shims, the jobs);
        a descendant that exited keeps the last CPU time seen."""
        me = psutil.Process()
        t = me.cpu_times()
        own = t.user + t.system
        for p in me.children(recursive=True):
            try:
                ct = p.cpu_times()
                self._seen[p.pid] = ct.user + ct.system
                if p.pid not in self._script:
                    args = p.cmdline()
                    self._script[p.pid] = args[-1] if args and args[-1].endswith(".py") else "other"
            except psutil.Error:
                continue
        return own + sum(self._seen.values())

    def tick(self, plane: ControlPlane, jobs: list[JobRecord], now: float) -> None:
        ct = psutil.cpu_times()
        busy = ct.user + ct.nice + ct.system + getattr(ct, "irq", 0.0) + getattr(ct, "softirq", 0.0)
        ours, t = self._ours(), time.monotonic()
        if self._last is not None:
            dt = t - self._last[2]
            if dt > 0.2:
                others = max(0.0, ((busy - self._last[0]) - (ours - self._last[1])) / dt)
                self.samples.append(others)
                running = sum(1 for j in jobs if j.phase == Phase.RUNNING)
                self.timeline.append((round(now, 2), running, round((ours - self._last[1]) / dt, 3), round(others, 3)))
        self._last = (busy, ours, t)

    @property
    def mean_cores(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else 0.0


@dataclass
class RealRun:
    """One real run and what the simulator needs to mirror it."""

    result: dict[str, Any]
    node_cpus: float
    background_cores: float
    timeline: list[tuple[float, int, float, float]] = field(default_factory=list)
    cpu_by_script: dict[str, float] = field(default_factory=dict)


def _real(policy: str, arrivals: list[Arrival], home: Path, policy_interval_s: float, reconcile_s: float) -> RealRun:
    bg = Background()
    with embedded_plane(home, policy, policy_interval_s=policy_interval_s, reconcile_interval_s=reconcile_s) as plane:
        cpus = sum(n.cpu for n in plane.engine.nodes())
        res: RunResult = run_workload(plane, arrivals, on_tick=bg.tick)
    return RealRun(as_dict(res), cpus, bg.mean_cores, bg.timeline, bg.cpu_by_script())


def background_of(real: RealRun, mean_only: bool = False) -> float | tuple[tuple[float, float], ...]:
    """What the simulator replays of the machine's other load: the samples of the real run
    (cores others used, per 0.5 s), or their mean (`mean_only`, or an old file without them)."""
    if mean_only or not real.timeline:
        return min(real.background_cores, real.node_cpus - 0.1)
    return tuple((t, min(others, real.node_cpus - 0.1)) for t, _, _, others in real.timeline)


def simulate(
    jobs: list[WorkloadJob],
    policy: str,
    cpus: float,
    reconcile_s: float,
    policy_interval_s: float,
    background_cpu: float | tuple[tuple[float, float], ...] = 0.0,
) -> SimResult:
    """The sim workload on one node of `cpus` cores (`background_cpu` of them busy with other
    work), rounds at the plane's reconcile interval, the policy at its own."""
    cfg = SimConfig(
        nodes=1,
        gpus_per_node=0,
        cpus_per_node=cpus,
        interval_s=reconcile_s,
        policy_options={"interval_s": policy_interval_s},
        background_cpu=background_cpu,
    )
    return run_simulation(jobs, policy, cfg)


@dataclass
class Comparison:
    policy: str
    real: dict[str, Any]
    sim: SimResult
    node_cpus: float
    background_cores: float
    timeline: list[tuple[float, int, float, float]] = field(default_factory=list)
    cpu_by_script: dict[str, float] = field(default_factory=dict)

    @property
    def sim_jct(self) -> dict[str, float | None]:
        return {j.name: j.jct_s for j in self.sim.jobs}

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "node_cpus": self.node_cpus,
            "background_cores": self.background_cores,
            "timeline": self.timeline,
            "cpu_by_script": self.cpu_by_script,
            "real": self.real,
            "sim": {
                "avg_jct_s": self.sim.avg_jct_s,
                "makespan_s": self.sim.makespan_s,
                "jobs": [{"name": j.name, "jct_s": j.jct_s, "restarts": j.restarts} for j in self.sim.jobs],
            },
        }


def compare(
    policies: list[str],
    *,
    stagger_s: float = 5.0,
    scale: float = 0.3,
    policy_interval_s: float = 10.0,
    reconcile_s: float = 0.5,
    profiles_dir: Path | None = None,
    profile_seconds: float = 10.0,
    refresh_profiles: bool = False,
    real_from: Path | None = None,
    mean_background: bool = False,
    out: Path | None = None,
    console: Console | None = None,
) -> list[Comparison]:
    """Profile (or reuse those in `profiles_dir`), run each policy for real (or reuse
    `real_from`), simulate, compare."""
    console = console or Console()
    arrivals = mixed_workload(stagger_s, scale)
    with tempfile.TemporaryDirectory(prefix="sluice-simreal-profiles-") as fresh:
        # No folder given: profile now, under the machine's present conditions (a step's CPU
        # cost moves with them by up to half, docs/benchmarks.md), and keep nothing.
        profiles = ensure_profiles(
            [example_of(a) for a in arrivals],
            profiles_dir or Path(fresh),
            seconds=profile_seconds,
            refresh=refresh_profiles,
            console=console,
        )
        jobs = sim_workload(arrivals, profiles)
        return _compare(
            jobs, arrivals, policies, policy_interval_s, reconcile_s, real_from, mean_background, out, console
        )


def read_real_runs(path: Path) -> dict[str, dict[str, Any]]:
    """The real runs of an earlier `--out` file by policy; ValueError naming the first problem
    (not JSON, not a list of runs, a run without its policy, real result or node figures)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a `bench simreal --out` file ({err})") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: not a `bench simreal --out` file (expected a list of runs)")
    out: dict[str, dict[str, Any]] = {}
    for i, c in enumerate(data):
        where = f"{path}: run {i + 1}"
        if not isinstance(c, dict) or not isinstance(c.get("policy"), str):
            raise ValueError(f"{where}: no policy")
        real = c.get("real")
        if not isinstance(real, dict) or not isinstance(real.get("jobs"), list):
            raise ValueError(f"{where} ({c['policy']}): no real run with its jobs")
        for key, what in (("node_cpus", "a positive"), ("background_cores", "a non-negative")):
            v = c.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"{where} ({c['policy']}): {key} must be {what} number, got {v!r}")
            if v <= 0 if key == "node_cpus" else v < 0:
                raise ValueError(f"{where} ({c['policy']}): {key} must be {what} number, got {v!r}")
        out[c["policy"]] = c
    return out


def _compare(
    jobs: list[WorkloadJob],
    arrivals: list[Arrival],
    policies: list[str],
    policy_interval_s: float,
    reconcile_s: float,
    real_from: Path | None,
    mean_background: bool,
    out: Path | None,
    console: Console,
) -> list[Comparison]:
    earlier = read_real_runs(real_from) if real_from is not None else {}
    out_rows: list[Comparison] = []
    with tempfile.TemporaryDirectory(prefix="sluice-simreal-") as tmp:
        for policy in policies:
            if policy in earlier:
                e = earlier[policy]
                real = RealRun(
                    e["real"],
                    float(e["node_cpus"]),
                    float(e["background_cores"]),
                    [tuple(x) for x in e.get("timeline", [])],
                    e.get("cpu_by_script", {}),
                )
            else:
                console.print(f"[bold]running the mixed workload under {policy} for real[/] ...")
                real = _real(policy, arrivals, Path(tmp) / policy, policy_interval_s, reconcile_s)
            sim = simulate(
                jobs, policy, real.node_cpus, reconcile_s, policy_interval_s, background_of(real, mean_background)
            )
            out_rows.append(
                Comparison(
                    policy,
                    real.result,
                    sim,
                    real.node_cpus,
                    real.background_cores,
                    real.timeline,
                    real.cpu_by_script,
                )
            )
    print_comparison(out_rows, console)
    if out is not None:
        out.write_text(json.dumps([c.as_dict() for c in out_rows], indent=2))
    return out_rows


def _f(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.1f}"


def _ratio(sim: float | None, real: float | None) -> str:
    if sim is None or real is None or not real or math.isnan(sim) or math.isnan(real):
        return "-"
    return f"{sim / real:.3f}"


def print_comparison(rows: list[Comparison], console: Console) -> None:
    load1, load5, _ = os.getloadavg()
    console.print(
        f"machine: {psutil.cpu_count()} CPUs, load average {load1:.1f} (1 min) / {load5:.1f} (5 min) "
        "at the end: a shared machine's number, not a quiet one's"
    )
    per_job = Table(title="JCT per job (s): real / simulated")
    per_job.add_column("job")
    for c in rows:
        per_job.add_column(f"{c.policy} real", justify="right")
        per_job.add_column(f"{c.policy} sim", justify="right")
        per_job.add_column("sim/real", justify="right")
    names = [j["name"] for j in rows[0].real["jobs"]] if rows else []
    for name in names:
        cells: list[str] = []
        for c in rows:
            real = next((j["jct_s"] for j in c.real["jobs"] if j["name"] == name), None)
            sim = c.sim_jct.get(name)
            cells += [_f(real), _f(sim), _ratio(sim, real)]
        per_job.add_row(name, *cells)
    console.print(per_job)
    summary = Table(title="mixed workload, real vs simulated")
    for col in (
        "policy",
        "avg JCT real (s)",
        "avg JCT sim (s)",
        "sim/real",
        "makespan real (s)",
        "makespan sim (s)",
        "sim/real",
        "cores: node / others took",
    ):
        summary.add_column(col, justify="right")
    for c in rows:
        summary.add_row(
            c.policy,
            _f(c.real["avg_jct_s"]),
            _f(c.sim.avg_jct_s),
            _ratio(c.sim.avg_jct_s, c.real["avg_jct_s"]),
            _f(c.real["makespan_s"]),
            _f(c.sim.makespan_s),
            _ratio(c.sim.makespan_s, c.real["makespan_s"]),
            f"{c.node_cpus:g} / {c.background_cores:.2f}",
        )
    console.print(summary)
