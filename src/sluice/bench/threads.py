"""`sluice bench threads`: what a live CPU cut costs a torch job, with and without the SDK
resizing its thread pool (`sluice.sdk._threads`).

One real job (`sluice.bench.threads_job`, a small MLP) under the node agent's real cgroup
limit, twice: with `SLUICE_THREADS=manual` (the pool stays at the size it started with —
what every job got before the SDK followed the allocation) and with the default `auto`.
Each run: `--before-s` seconds at `--from-cores`, then the limit is cut live to `--to-cores`
and the job runs `--after-s` more. Steps per second come from the job's own report times
(the first seconds after each change are skipped: the pool resizes at the next check).
Prints the load average, since the machine may be shared.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sluice.agent.cgroup import remove_root
from sluice.agent.node_agent import NodeAgent
from sluice.model import Allocation, JobProgress, LaunchRequest
from sluice.settings import Settings
from sluice.spec import JobSpec

SETTLE_S = 2.0
"""Seconds skipped after a start or a cut before steps are counted."""


@dataclass(frozen=True, slots=True)
class CutRun:
    mode: str
    threads_before: int
    threads_after: int
    steps_s_before: float
    steps_s_after: float

    @property
    def kept(self) -> float:
        """Speed after the cut as a share of the speed before it."""
        return self.steps_s_after / self.steps_s_before if self.steps_s_before > 0 else 0.0


def _rate(points: list[tuple[float, int]], t0: float, t1: float) -> float:
    inside = [(t, s) for t, s in points if t0 <= t <= t1]
    if len(inside) < 2:
        return 0.0
    (ta, sa), (tb, sb) = inside[0], inside[-1]
    return (sb - sa) / (tb - ta) if tb > ta else 0.0


def _one(mode: str, home: Path, before_s: float, after_s: float, cores: tuple[float, float]) -> CutRun:
    cgroup_root = f"sluice-bench-threads-{os.getpid()}-{mode}"
    settings = Settings(home=home / mode, cgroup_root=cgroup_root, usage_sample_s=1.0)
    agent = NodeAgent("n0", settings.runs_dir, settings=settings)
    try:
        spec = JobSpec(
            command=["python", "-m", "sluice.bench.threads_job"],
            env={"SLUICE_THREADS": mode, "SLUICE_THREADS_CHECK_S": "0.5"},
        )
        alloc = Allocation.single("n0", cores[0], cores[0])
        agent.launch(LaunchRequest("thr", 1, "bench", spec, alloc, str(home / mode / "ckpt")))
        points: list[tuple[float, int]] = []
        threads: list[tuple[float, int]] = []

        def collect(until: float) -> None:
            while time.time() < until:
                for e in agent.poll():
                    if isinstance(e, JobProgress) and e.job_id == "thr":
                        points.append((e.time, e.step))
                        threads.append((e.time, int(e.metrics.get("threads", 0))))
                time.sleep(0.1)

        deadline = time.time() + 120
        while not points and time.time() < deadline:  # torch's import comes first
            collect(time.time() + 0.5)
        if not points:
            raise RuntimeError(f"the job never reported; see {agent.log_path('thr')}")
        start = points[0][0]
        collect(start + SETTLE_S + before_s)
        cut = time.time()
        agent.resize("thr", 1, Allocation.single("n0", cores[1], cores[1]))
        collect(cut + SETTLE_S + after_s)
        agent.stop("thr", 1, checkpoint=False)
        t_before = [n for t, n in threads if start + SETTLE_S <= t <= cut]
        t_after = [n for t, n in threads if t >= cut + SETTLE_S]
        return CutRun(
            mode,
            t_before[-1] if t_before else 0,
            t_after[-1] if t_after else 0,
            _rate(points, start + SETTLE_S, cut),
            _rate(points, cut + SETTLE_S, cut + SETTLE_S + after_s),
        )
    finally:
        agent.close()
        remove_root(cgroup_root)


def run(
    before_s: float = 15.0,
    after_s: float = 15.0,
    from_cores: float = 2.0,
    to_cores: float = 1.0,
    out: Path | None = None,
    console: Console | None = None,
) -> list[CutRun]:
    console = console or Console()
    load = os.getloadavg()
    console.print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs")
    runs: list[CutRun] = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-threads-") as tmp:
        for mode in ("manual", "auto"):
            console.print(f"running with SLUICE_THREADS={mode} ...")
            runs.append(_one(mode, Path(tmp), before_s, after_s, (from_cores, to_cores)))
    load = os.getloadavg()
    t = Table(title=f"live CPU cut {from_cores:g} → {to_cores:g} cores (quota), small MLP, torch")
    for col in (
        "SLUICE_THREADS",
        "threads before",
        "threads after",
        "steps/s before",
        "steps/s after",
        "after / before",
    ):
        t.add_column(col, justify="right")
    for r in runs:
        t.add_row(
            r.mode,
            str(r.threads_before),
            str(r.threads_after),
            f"{r.steps_s_before:.1f}",
            f"{r.steps_s_after:.1f}",
            f"{r.kept:.2f}",
        )
    console.print(t)
    manual, auto = runs
    if manual.steps_s_after > 0:
        console.print(
            f"after the cut, the pool that follows it runs {auto.steps_s_after / manual.steps_s_after:.1f}× as fast"
        )
    console.print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if out is not None:
        out.write_text(json.dumps([{**asdict(r), "after_over_before": r.kept} for r in runs], indent=2))
    return runs
