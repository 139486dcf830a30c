"""Simulated job models: how fast a job progresses under an allocation, and when it ends.

Three kinds, one small interface (`JobModel`) so the engine treats them alike:
- `GpuAppJob`: one of the measured Pollux applications (step time per placement, gradient
  statistics per epoch); fixed batch (the user's) or adaptive batch (AdaptDL-style);
- `TraceJob`: a job from a cluster trace that only says how long it ran on how many GPUs;
- `CpuJob`: a FlowCon/SpeCon-style container job whose speed follows its CPU share and whose
  loss follows a learning curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from sluice.model import Allocation, OracleInfo
from sluice.sim.apps import RESTART_PENALTY_S, Application, BatchConfig, Placement

TRACE_SCALING_EXPONENT = 0.8
"""A trace job on G GPUs instead of the G0 it ran on goes (G/G0)^0.8 as fast (sub-linear)."""

TRACE_SPREAD_PENALTY = 0.95
"""Speed factor per extra node a trace job is spread over (network-bound gradient sync)."""


def placement_of(alloc: Allocation | None) -> Placement:
    """GPUs per node, in ascending order (the order the measurements use), zeros dropped."""
    if alloc is None:
        return ()
    return tuple(sorted(g for g in alloc.gpus_per_node().values() if g > 0))


class JobModel(Protocol):
    kind: str
    restarts: int

    @property
    def step(self) -> int: ...
    @property
    def total_steps(self) -> int: ...
    @property
    def done(self) -> bool: ...
    def place(self, alloc: Allocation) -> None: ...
    def reallocate(self, alloc: Allocation) -> bool: ...
    def suspend(self) -> None: ...
    def rollback(self, seconds: float) -> None: ...
    def advance(self, dt: float, cpu: float) -> float | None: ...
    def cpu_demand(self, alloc: Allocation) -> float: ...
    def loss(self) -> float | None: ...
    def speedup(self, alloc: Allocation) -> float: ...
    def oracle(self) -> OracleInfo:
        """Ground truth about this job, for oracle (upper-bound) studies only."""
        ...


@dataclass
class GpuAppJob:
    """A Pollux application job. Progress is counted in reference-batch steps; it advances
    by gain / iteration time per second, and the job ends after the application's epochs."""

    app: Application
    batch_size: int
    requested_gpus: int
    adaptive: bool = False
    kind: str = "gpu"
    progress: float = 0.0
    epoch: int = 0
    placement: Placement = ()
    cfg: BatchConfig | None = None
    penalty_left: float = 0.0
    restarts: int = -1
    finished: bool = False
    _rates: dict[tuple[Placement, int], float] = field(default_factory=dict, repr=False)

    @property
    def step(self) -> int:
        return int(self.progress)

    @property
    def total_steps(self) -> int:
        return math.ceil(self.app.total_progress)

    @property
    def done(self) -> bool:
        return self.finished

    @property
    def max_gpus(self) -> int:
        """Most GPUs the job can use: one micro-batch of at least the smallest size per GPU."""
        cap = self.app.max_batch_size // self.app.min_local_bsz
        if not self.adaptive:
            cap = min(cap, max(1, self.batch_size // self.app.min_local_bsz))
        return max(1, min(64, cap, max(self.requested_gpus, cap)))

    def _config(self, placement: Placement) -> BatchConfig:
        if self.adaptive:
            return self.app.best_config(placement, self.epoch)
        return self.app.fixed_config(sum(placement), self.batch_size)

    def rate(self, placement: Placement) -> float:
        """Progress per second on this placement at the current epoch (0 for no GPUs)."""
        if not placement:
            return 0.0
        key = (placement, self.epoch)
        r = self._rates.get(key)
        if r is None:
            r = self.app.goodput(placement, self._config(placement), self.epoch)
            self._rates[key] = r
        return r

    def place(self, alloc: Allocation) -> None:
        self.placement = placement_of(alloc)
        self.cfg = self._config(self.placement) if self.placement else None
        self.penalty_left = RESTART_PENALTY_S
        self.restarts += 1

    def reallocate(self, alloc: Allocation) -> bool:
        if placement_of(alloc) == self.placement:
            return False
        self.place(alloc)
        return True

    def suspend(self) -> None:
        self.placement = ()
        self.cfg = None
        self.penalty_left = 0.0

    def rollback(self, seconds: float) -> None:
        """Lose the work of the last `seconds` (since the last checkpoint), not past an epoch."""
        lost = self.rate(self.placement) * seconds if self.placement else 0.0
        self.progress = max(self.app.progress_at(self.epoch), self.progress - lost)

    def advance(self, dt: float, cpu: float) -> float | None:
        if not self.placement or self.finished:
            return None
        used = 0.0
        pause = min(self.penalty_left, dt)
        self.penalty_left -= pause
        used += pause
        while used < dt - 1e-9:
            r = self.rate(self.placement)
            target = self.app.progress_at(self.epoch + 1)
            left = dt - used
            if self.progress + r * left < target:
                self.progress += r * left
                used = dt
            else:
                used += (target - self.progress) / r
                self.progress = target
                self.epoch += 1
                if self.epoch >= self.app.max_epochs:
                    self.finished = True
                    return used
                if self.adaptive:
                    self.cfg = self._config(self.placement)
        return None

    def cpu_demand(self, alloc: Allocation) -> float:
        return alloc.total_cpu_request

    def loss(self) -> float | None:
        return None

    def noise_metrics(self) -> dict[str, float]:
        """What the job's own `sdk.GradientNoiseScale` would report: its gradient noise scale
        at the batch and epoch it trains at now (B_noise = tr(Σ)/|G|², in samples; the
        measured statistics give the variance at the reference batch, hence × B0), that batch,
        and the reference batch its progress is counted in. Nothing while it holds no GPUs."""
        if self.cfg is None:
            return {}
        batch = self.cfg.batch_size
        sqr, var = self.app.grad_stats(self.epoch, batch)
        if sqr <= 0:
            return {}
        b0 = float(self.app.init_batch_size)
        return {"grad_noise_scale": var * b0 / sqr, "gns_batch": float(batch), "ref_batch": b0}

    def speedup(self, alloc: Allocation) -> float:
        return self.rate(placement_of(alloc)) / self.rate((1,))

    def remaining_ref_s(self) -> float:
        """Seconds left on one GPU at today's efficiency (the reference for `speedup`)."""
        return max(0.0, self.app.total_progress - self.progress) / self.rate((1,))

    def oracle(self) -> OracleInfo:
        return OracleInfo(self.remaining_ref_s(), 1, self.speedup, RESTART_PENALTY_S)


@dataclass
class TraceJob:
    """A trace job: `duration_s` of work on `gpus` GPUs; other sizes scale sub-linearly."""

    duration_s: float
    gpus: int
    kind: str = "trace"
    done_s: float = 0.0
    """Reference seconds of work done."""
    placement: Placement = ()
    penalty_left: float = 0.0
    restarts: int = -1
    finished: bool = False

    @property
    def step(self) -> int:
        return int(self.done_s)

    @property
    def total_steps(self) -> int:
        return max(1, math.ceil(self.duration_s))

    @property
    def done(self) -> bool:
        return self.finished

    def rate(self, placement: Placement) -> float:
        g = sum(placement)
        if g <= 0:
            return 0.0
        return (g / self.gpus) ** TRACE_SCALING_EXPONENT * TRACE_SPREAD_PENALTY ** (len(placement) - 1)

    def place(self, alloc: Allocation) -> None:
        self.placement = placement_of(alloc)
        self.penalty_left = RESTART_PENALTY_S if self.restarts >= 0 else 0.0
        self.restarts += 1

    def reallocate(self, alloc: Allocation) -> bool:
        if placement_of(alloc) == self.placement:
            return False
        self.place(alloc)
        return True

    def suspend(self) -> None:
        self.placement = ()
        self.penalty_left = 0.0

    def rollback(self, seconds: float) -> None:
        self.done_s = max(0.0, self.done_s - self.rate(self.placement) * seconds)

    def advance(self, dt: float, cpu: float) -> float | None:
        if not self.placement or self.finished:
            return None
        pause = min(self.penalty_left, dt)
        self.penalty_left -= pause
        r = self.rate(self.placement)
        need = (self.duration_s - self.done_s) / r
        if need <= dt - pause:
            self.done_s = self.duration_s
            self.finished = True
            return pause + need
        self.done_s += r * (dt - pause)
        return None

    def cpu_demand(self, alloc: Allocation) -> float:
        return alloc.total_cpu_request

    def loss(self) -> float | None:
        return None

    def speedup(self, alloc: Allocation) -> float:
        return self.rate(placement_of(alloc))

    @property
    def max_gpus(self) -> int:
        """What the job declares it can use: up to twice the GPUs it ran on in the trace."""
        return max(1, min(64, self.gpus * 2))

    def oracle(self) -> OracleInfo:
        return OracleInfo(max(0.0, self.duration_s - self.done_s), self.gpus, self.speedup, RESTART_PENALTY_S)


@dataclass(frozen=True)
class CpuCurve:
    """A CPU job's profile: steps/s at `cores` (measured points, interpolated linearly and
    flat beyond the last), and its loss curve loss(k) = floor + (start - floor) / (1 + k / half)."""

    cores: tuple[float, ...]
    steps_per_s: tuple[float, ...]
    loss_start: float = 2.5
    loss_floor: float = 0.2
    loss_half_steps: float = 200.0
    startup_cpu_s: float | None = None
    """Measured start-up (interpreter, imports, checkpoint restore) as CPU work: core-seconds
    on one thread before the first step. None: not measured (the job's fixed `startup_s` pause)."""
    startup_wait_s: float = 0.0
    """Measured start-up latency that no CPU share shortens (process spawn, first report's I/O)."""

    def throughput(self, cores: float) -> float:
        if cores <= 0:
            return 0.0
        xs, ys = self.cores, self.steps_per_s
        if cores <= xs[0]:
            return ys[0] * cores / xs[0]
        for i in range(1, len(xs)):
            if cores <= xs[i]:
                f = (cores - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + f * (ys[i] - ys[i - 1])
        return ys[-1]

    @property
    def saturation(self) -> float:
        """Cores beyond which the job gets no faster (what it will take if allowed)."""
        best = max(self.steps_per_s)
        return next(c for c, s in zip(self.cores, self.steps_per_s, strict=True) if s >= 0.98 * best)

    def loss_at(self, step: float) -> float:
        return self.loss_floor + (self.loss_start - self.loss_floor) / (1.0 + step / self.loss_half_steps)


@dataclass
class CpuJob:
    curve: CpuCurve
    steps: int
    kind: str = "cpu"
    done_steps: float = 0.0
    restarts: int = -1
    running: bool = False
    penalty_left: float = 0.0
    finished: bool = False
    startup_s: float = 5.0
    """Seconds a container takes to start (and restore its checkpoint) before it trains, when
    the curve has no measured start-up; with one, start-up is CPU work (see `_starting`)."""
    startup_work_left: float = 0.0
    """Core-seconds of measured start-up still to run (one thread: at most one core's worth per second)."""

    @property
    def step(self) -> int:
        return int(self.done_steps)

    @property
    def total_steps(self) -> int:
        return self.steps

    @property
    def done(self) -> bool:
        return self.finished

    def place(self, alloc: Allocation) -> None:
        self.running = True
        if self.curve.startup_cpu_s is None:
            self.penalty_left = self.startup_s
        else:
            self.penalty_left = self.curve.startup_wait_s
            self.startup_work_left = self.curve.startup_cpu_s
        self.restarts += 1

    def reallocate(self, alloc: Allocation) -> bool:
        return False  # a CPU limit changes live (CFS quota); nothing restarts

    def suspend(self) -> None:
        self.running = False
        self.penalty_left = 0.0
        self.startup_work_left = 0.0

    def _starting(self, dt: float, cpu: float) -> float:
        """Run the measured start-up for up to `dt` seconds on `cpu` cores; the seconds it took.

        Start-up is one interpreter importing torch and friends: single-threaded CPU work, so
        under contention it stretches with the share the job gets, as the real process does
        (measured by `sluice sim profile` at several CPU limits)."""
        used = min(self.penalty_left, dt)
        self.penalty_left -= used
        rate = min(cpu, 1.0)
        if self.startup_work_left > 0 and used < dt and rate > 0:
            step = min(dt - used, self.startup_work_left / rate)
            self.startup_work_left -= step * rate
            if self.startup_work_left < 1e-9:
                self.startup_work_left = 0.0
            used += step
        elif self.startup_work_left > 0:
            used = dt  # no CPU this interval: still starting
        return used

    def rollback(self, seconds: float) -> None:
        self.done_steps = max(0.0, self.done_steps - self.curve.throughput(self.curve.saturation) * seconds)

    def advance(self, dt: float, cpu: float) -> float | None:
        if not self.running or self.finished:
            return None
        pause = self._starting(dt, cpu)
        if pause >= dt:
            return None
        r = self.curve.throughput(cpu)
        if r <= 0:
            return None
        need = (self.steps - self.done_steps) / r
        if need <= dt - pause:
            self.done_steps = float(self.steps)
            self.finished = True
            return pause + need
        self.done_steps += r * (dt - pause)
        return None

    def cpu_demand(self, alloc: Allocation) -> float:
        if self.startup_work_left > 0:
            return 1.0  # one interpreter thread importing: it takes a whole core if offered
        if self.penalty_left > 0:
            return min(0.5, self.curve.saturation)
        return self.curve.saturation

    def loss(self) -> float | None:
        return self.curve.loss_at(self.done_steps)

    def speedup(self, alloc: Allocation) -> float:
        a = alloc.assignments[0]
        cores = a.cpu_limit if a.cpu_limit is not None else self.curve.saturation
        return self.curve.throughput(cores) / max(self.curve.throughput(1.0), 1e-9)

    def oracle(self) -> OracleInfo:
        left = (self.steps - self.done_steps) / max(self.curve.throughput(1.0), 1e-9)
        c = self.curve
        restart = self.startup_s if c.startup_cpu_s is None else c.startup_cpu_s + c.startup_wait_s
        return OracleInfo(left, 0, self.speedup, restart)
