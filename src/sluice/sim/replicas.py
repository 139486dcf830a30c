"""Simulated CPU data-parallel jobs: speed by replica count, as measured on a real machine.

Why: `sluice bench elastic` runs a small real workload under policy-driven resizing; to set
the simulator's prediction beside it, the simulator needs a job whose speed depends on its
number of replicas the way the real one's does. Nothing here is assumed: a
`ReplicaProfile` holds what the bench measured on the machine at hand — steps/s at each
replica count (from rank 0's own clock), the seconds from submit to the first step, the
seconds a resize loses (old attempt's last step to the new one's first) and the seconds
from the last step to the job's recorded end — and `ReplicaJob` replays them: a fresh start
pauses `start_s`, each relaunch at a new size `resize_s`, the end `end_s`, and in between the
job runs at its size's measured speed (interpolated between measured counts, flat beyond).
CPU contention with other jobs is not modelled (the measurement already holds the machine's
own); the per-core CPU model is `jobs.CpuJob`'s.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from sluice.model import Allocation, OracleInfo


@dataclass(frozen=True)
class ReplicaProfile:
    replicas: tuple[int, ...]
    steps_per_s: tuple[float, ...]
    start_s: tuple[float, ...]
    """Submit to the first step of a fresh start at each count (placement, launch, imports,
    rendezvous): more processes take longer to start on a small machine."""
    resize_s: float
    """Seconds a resize loses: the old attempt's last step to the new attempt's first."""
    end_s: float = 0.0
    """The last step to the job's recorded end (exit and the plane noticing it)."""

    def __post_init__(self) -> None:
        if not self.replicas or len(self.replicas) != len(self.steps_per_s):
            raise ValueError("a replica profile needs as many steps/s as replica counts, at least one")
        if list(self.replicas) != sorted(set(self.replicas)) or self.replicas[0] < 1:
            raise ValueError(f"replica counts must be ascending and positive, got {self.replicas}")
        if len(self.start_s) != len(self.replicas):
            raise ValueError("a replica profile needs a start-up time per replica count")
        if min(self.steps_per_s) <= 0 or min(*self.start_s, self.resize_s, self.end_s) < 0:
            raise ValueError("steps/s must be positive and the times non-negative")

    def rate(self, n: int) -> float:
        """Steps/s at n replicas: measured, log-interpolated between counts, flat beyond."""
        xs, ys = self.replicas, self.steps_per_s
        if n <= 0:
            return 0.0
        if n <= xs[0]:
            return ys[0]
        for i in range(1, len(xs)):
            if n == xs[i]:
                return ys[i]
            if n < xs[i]:
                f = math.log(n / xs[i - 1]) / math.log(xs[i] / xs[i - 1])
                return math.exp(math.log(ys[i - 1]) + f * (math.log(ys[i]) - math.log(ys[i - 1])))
        return ys[-1]

    def start_at(self, n: int) -> float:
        """Start-up at n replicas: that of the largest measured count not above n."""
        return next(
            (t for k, t in zip(self.replicas[::-1], self.start_s[::-1], strict=True) if k <= n), self.start_s[0]
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> ReplicaProfile:
        d = json.loads(Path(path).read_text())
        return cls(
            tuple(int(r) for r in d["replicas"]),
            tuple(float(s) for s in d["steps_per_s"]),
            tuple(float(t) for t in d["start_s"]),
            float(d["resize_s"]),
            float(d.get("end_s", 0.0)),
        )


@dataclass
class ReplicaJob:
    """A CPU data-parallel job of `steps` steps; its speed is its replica count's."""

    profile: ReplicaProfile
    steps: int
    kind: str = "replicas"
    done_steps: float = 0.0
    replicas: int = 0
    penalty_left: float = 0.0
    tail_left: float = 0.0
    restarts: int = -1
    finished: bool = False

    @property
    def step(self) -> int:
        return int(self.done_steps)

    @property
    def total_steps(self) -> int:
        return self.steps

    @property
    def done(self) -> bool:
        return self.finished

    @property
    def starting(self) -> bool:
        """Still starting (no step run yet in this attempt): a real job reports no progress
        before its first step, so the engine sends none (the tracker's baseline comes after)."""
        return self.penalty_left > 0

    def place(self, alloc: Allocation) -> None:
        self.replicas = alloc.replicas
        self.penalty_left = self.profile.start_at(self.replicas) if self.restarts < 0 else self.profile.resize_s
        self.restarts += 1

    def reallocate(self, alloc: Allocation) -> bool:
        """The sim engine resizes in place (`gpu_resize`); a new replica count is then what a
        real engine's checkpointed stop and relaunch is: the measured resize cost."""
        if alloc.replicas == self.replicas:
            return False
        self.place(alloc)
        return True

    def suspend(self) -> None:
        self.replicas = 0
        self.penalty_left = 0.0

    def rollback(self, seconds: float) -> None:
        self.done_steps = max(0.0, self.done_steps - self.profile.rate(self.replicas) * seconds)

    def advance(self, dt: float, cpu: float) -> float | None:
        if not self.replicas or self.finished:
            return None
        pause = min(self.penalty_left, dt)
        self.penalty_left -= pause
        used = pause
        if self.done_steps < self.steps:
            r = self.profile.rate(self.replicas)
            need = (self.steps - self.done_steps) / r
            if need > dt - used:
                self.done_steps += r * (dt - used)
                return None
            self.done_steps = float(self.steps)
            used += need
            self.tail_left = self.profile.end_s
        tail = min(self.tail_left, dt - used)
        self.tail_left -= tail
        used += tail
        if self.tail_left > 1e-9:
            return None
        self.finished = True
        return used

    def cpu_demand(self, alloc: Allocation) -> float:
        return alloc.total_cpu_request

    def loss(self) -> float | None:
        return None

    def speedup(self, alloc: Allocation) -> float:
        return self.profile.rate(alloc.replicas) / self.profile.rate(self.profile.replicas[0])

    def oracle(self) -> OracleInfo:
        left = (self.steps - self.done_steps) / self.profile.rate(self.profile.replicas[0])
        return OracleInfo(left, 0, self.speedup, self.profile.resize_s)
