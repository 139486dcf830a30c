"""`sluice sim profile`: measure a real example job at several CPU limits on the local engine
and save the curves the simulator's CPU jobs follow.

The job runs through the production Controller with a one-line policy that pins it at one
CPU limit (a real kernel CFS quota on the local engine), once per limit, each run cut
`seconds` after its first progress report. Steady-state steps/s per limit gives the
throughput curve; the loss reports of the longest run give the learning curve.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sluice.control.controller import Controller
from sluice.model import Allocation, ClusterView, Decision, Event, JobProgress, NodeDecision, Place
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
    """A round observer that only listens: it collects the job's progress reports."""

    def __init__(self, points: list[tuple[float, int, float | None]]) -> None:
        self.points = points

    def observe(self, view: ClusterView, events: Sequence[Event]) -> list[NodeDecision]:
        self.points.extend((e.time, e.step, e.loss) for e in events if isinstance(e, JobProgress))
        return []


@dataclass
class ProfileRun:
    cores: float
    steps_per_s: float
    points: list[tuple[float, int, float | None]] = field(default_factory=list)


def _run_once(spec: JobSpec, cores: float, seconds: float, home: Path) -> ProfileRun:
    from sluice.engine.local import LocalEngine

    settings = Settings(home=home, reconcile_interval_s=0.5)
    engine = LocalEngine(settings)
    ctl = Controller(MemoryStore(), engine, _Pin(cores), checkpoint_root=str(home / "ckpt"))
    points: list[tuple[float, int, float | None]] = []

    ctl.add_observer(_ProgressWatch(points))
    job = ctl.submit("profile", spec)

    def done() -> bool:
        rec = ctl.book.get(job.id)
        return rec is None or rec.phase.terminal

    t0 = time.monotonic()
    give_up = t0 + max(6 * seconds, 120.0)  # start-up (imports) can be slow on a busy machine
    try:
        while not done() and time.monotonic() < give_up:
            ctl.step()
            # Measure `seconds` of training, counted from the first progress report.
            if points and points[-1][0] - points[0][0] >= seconds:
                break
            time.sleep(0.5)
        if not done():
            ctl.cancel(job.id, "profile run long enough")
            deadline = time.monotonic() + 30
            while not done() and time.monotonic() < deadline:
                ctl.step()
                time.sleep(0.2)
    finally:
        engine.close()
    steady = points[len(points) // 4 :] if len(points) >= 8 else points
    rate = 0.0
    if len(steady) >= 2 and steady[-1][0] > steady[0][0]:
        rate = (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
    return ProfileRun(cores, max(rate, 0.0), points)


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
    curve = CpuCurve(tuple(r.cores for r in runs), tuple(r.steps_per_s for r in runs), start, floor, half)
    return curve, runs
