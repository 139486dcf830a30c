"""`sluice bench agent`: what watching jobs costs the node agent, per way of limiting CPU.

Six (by default) real SDK jobs report progress 20 times a second each; one NodeAgent polls
them at the control plane's reconcile interval, sampling CPU usage per job every second.
We measure the CPU time the polling process itself spends (time.process_time) and print
it as a share of one core, for each contender side by side:

- cgroup:   the detected kernel mechanism (usage from one cgroup counter file per job);
- affinity: the fallback where no cgroup is writable (usage summed over each job's process
            tree with psutil).

The target is that agents (and the control plane) stay under 5 % of one core with six jobs.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sluice.agent.cgroup import SYSFS_CGROUP, CgroupKind, CgroupLayout, detect_cgroups
from sluice.agent.node_agent import NodeAgent
from sluice.model import Allocation, JobExited, JobProgress, JobUsage, LaunchRequest
from sluice.settings import Settings
from sluice.spec import JobSpec

JOB = (
    "import time\n"
    "from sluice import sdk\n"
    "step = 0\n"
    "while not sdk.should_stop():\n"
    "    time.sleep(0.05)\n"
    "    sdk.report(step, loss=1.0 / (step + 1), total_steps=10**9)\n"
    "    step += 1\n"
)


@dataclass
class Result:
    contender: str
    polls: int
    progress_events: int
    usage_events: int
    cpu_s: float
    wall_s: float

    @property
    def core_pct(self) -> float:
        return 100.0 * self.cpu_s / self.wall_s


def _measure(name: str, layout: CgroupLayout, jobs: int, seconds: float, interval: float, home: Path) -> Result:
    settings = Settings(home=home, stop_grace_s=5.0, usage_sample_s=1.0, kpi_sample_s=1.0)
    agent = NodeAgent("bench", home / "runs", settings=settings, layout=layout)
    spec = JobSpec(command=["python", "-c", JOB], workdir=str(home))
    ids = [f"{name}-{i}" for i in range(jobs)]
    for job_id in ids:
        agent.launch(
            LaunchRequest(job_id, 1, "bench", spec, Allocation.single("bench", 0.25, 0.5), str(home / "ck" / job_id))
        )
    # warm-up: every job imported the SDK and reports
    reporting: set[str] = set()
    deadline = time.monotonic() + 120
    while len(reporting) < jobs and time.monotonic() < deadline:
        reporting |= {e.job_id for e in agent.poll() if isinstance(e, JobProgress)}
        time.sleep(interval)
    polls = progress = usage = 0
    cpu0, t0 = time.process_time(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        events = agent.poll()
        polls += 1
        progress += sum(isinstance(e, JobProgress) for e in events)
        usage += sum(isinstance(e, JobUsage) for e in events)
        time.sleep(interval)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    for job_id in ids:
        agent.stop(job_id, 1, checkpoint=False)
    left = set(ids)
    deadline = time.monotonic() + 30
    while left and time.monotonic() < deadline:
        left -= {e.job_id for e in agent.poll() if isinstance(e, JobExited)}
        time.sleep(0.1)
    agent.close()
    return Result(name, polls, progress, usage, cpu, wall)


def run(jobs: int = 6, seconds: float = 30.0, interval: float = 0.5) -> list[Result]:
    console = Console()
    base = Path(tempfile.mkdtemp(prefix="sluice-bench-agent-"))
    root = f"sluice-bench-{uuid.uuid4().hex[:6]}"
    detected = detect_cgroups(root=root)
    contenders: list[tuple[str, CgroupLayout]] = []
    if detected.kind is not CgroupKind.AFFINITY:
        contenders.append((str(detected.kind), detected))
    contenders.append(("affinity", CgroupLayout(CgroupKind.AFFINITY, reason="benchmark contender")))
    results = []
    try:
        for name, layout in contenders:
            console.print(f"[bold]{name}[/]: {jobs} jobs, polling every {interval}s for {seconds}s ...")
            results.append(_measure(name, layout, jobs, seconds, interval, base / name))
    finally:
        shutil.rmtree(base, ignore_errors=True)
        for parent in (detected.cpu_parent, detected.cpuacct_parent, detected.memory_parent):
            if parent is not None:
                with contextlib.suppress(OSError):
                    parent.rmdir()
        for hierarchy in ("blkio", "unified"):  # the node groups' parents beside them
            with contextlib.suppress(OSError):
                (SYSFS_CGROUP / hierarchy / root).rmdir()
    table = Table(title=f"node agent overhead: {jobs} SDK jobs reporting at 20 Hz, poll every {interval}s")
    for col in ("contender", "polls", "progress events", "usage samples", "agent CPU (% of 1 core)", "vs first"):
        table.add_column(col, justify="right")
    first = results[0].core_pct
    for r in results:
        table.add_row(
            r.contender,
            str(r.polls),
            str(r.progress_events),
            str(r.usage_events),
            f"{r.core_pct:.2f}",
            f"{r.core_pct / first:.2f}x" if first > 0 else "-",
        )
    console.print(table)
    return results
