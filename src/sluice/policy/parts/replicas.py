"""CPU data-parallel jobs sized in replicas from their own measured speed.

Why: on CPU the speed-up of more replicas is anything but given — on a 2-core machine two
gloo replicas of the example run at 0.4× of one (docs/benchmarks.md, `bench elastic`),
while on a node with idle cores and a compute-heavy step they can nearly double it. So a
job with `resources.replicas: {min, max}` starts at `min`, and its speed at other sizes comes
from its learned curve (`speedup.LearnedCurve` over replicas, fitted from the steps/s
measured at each size it has run at). A size never measured is tried only up to twice the
largest measured (the exploration bound), only once the size it runs at has been measured
(`MIN_MEASURED_S`), and only where the replicas fit in the cores free now; GPU jobs are
sized by the GPU half of each policy.

`ReplicaCurves` is what every policy reads (`pollux`, `optimus` through `sizing.size_by_gain`);
`ReplicaSizer` is `sluice`'s own rule: per job, the size that finishes it soonest, counting
the restart a resize costs and a margin against the curve's error.

Both return decisions and act on nothing: the controller carries a replica change out as a
checkpointed stop and relaunch at the new size (docs/architecture.md, "Elastic resize").
"""

from __future__ import annotations

from sluice.model import ClusterView, JobView, Phase, Resize
from sluice.policy.parts.capacity import Ledger
from sluice.policy.parts.elastic import DEFAULT_REMAINING_S, DEFAULT_RESTART_S, restart_measured, restart_s
from sluice.policy.parts.gpu import uses_gpus
from sluice.policy.parts.ordering import ready
from sluice.policy.parts.speedup import LearnedCurve
from sluice.policy.parts.units import ReplicaUnits

REPLICA_EXPLORE_FACTOR = 2
"""At most twice the most replicas measured: every CPU resize is a checkpointed restart of
all replicas (seconds to tens of seconds here), so sizes are explored a step at a time."""

MIN_MEASURED_S = 20.0
"""A size is judged only once it has been measured over at least this many seconds."""


def elastic_cpu_jobs(view: ClusterView) -> list[JobView]:
    """Running CPU jobs whose spec leaves a replica range to choose in."""
    return [
        j
        for j in view.jobs.values()
        if j.phase == Phase.RUNNING
        and j.allocation is not None
        and not uses_gpus(j)
        and j.replicas_max > j.replicas_min
    ]


def cpu_jobs(view: ClusterView) -> list[JobView]:
    """CPU-only jobs a sizing policy plans this round, oldest first: those running and those
    queued and past their restart back-off."""
    queued, _ = ready(view, view.queued)
    jobs = [j for j in view.jobs.values() if j.phase in (Phase.STARTING, Phase.RUNNING)] + queued
    return sorted((j for j in jobs if not uses_gpus(j)), key=lambda j: (j.submitted_at, j.id))


def held_replicas(job: JobView) -> int:
    return job.allocation.replicas if job.allocation is not None else 0


class ReplicaCurves:
    """Each CPU job's speed-up over replicas (relative to its `replicas_min`), learned from its
    measured steps/s; the `sizing.Curves` of CPU jobs."""

    def __init__(self, learn: bool = True, explore_factor: int = REPLICA_EXPLORE_FACTOR) -> None:
        self.learn = learn
        self.explore_factor = explore_factor
        self._curves: dict[str, LearnedCurve] = {}

    def curve(self, job: JobView) -> LearnedCurve:
        c = self._curves.get(job.id)
        if c is None:
            c = self._curves[job.id] = LearnedCurve(job.progress.rates if self.learn else (), unit="replicas")
        return c

    def __call__(self, job: JobView, n: int) -> float:
        return self.curve(job).speedup(n, max(job.replicas_min, 1))

    def settled(self, job: JobView) -> bool:
        """Whether the size a running job holds has been measured long enough to judge."""
        n = held_replicas(job)
        here = [s for s in job.progress.rates if s.replicas == n and s.gpus == 0]
        return bool(here) and max(s.seconds for s in here) >= MIN_MEASURED_S

    def least(self, job: JobView) -> int:
        """The spec's min; a running job not yet measured where it is keeps its size."""
        if job.allocation is not None and not self.settled(job):
            return max(held_replicas(job), 1)
        return max(job.replicas_min, 1)

    def most(self, job: JobView) -> int:
        """The spec's max, within the exploration bound; a job still being measured at its
        size, or never measured, gets no more than it holds (or its min)."""
        if job.allocation is not None and not self.settled(job):
            return self.least(job)
        if not self.learn:
            return max(job.replicas_max, job.replicas_min)
        cap = self.curve(job).explore_cap(job.replicas_min, self.explore_factor)
        return max(min(job.replicas_max, cap), job.replicas_min)

    def remaining_ref_s(self, job: JobView) -> float:
        """Seconds left at `replicas_min`: steps left at the learned speed there; unknown
        length or speed: the attained service in replica-seconds, at least DEFAULT_REMAINING_S."""
        pr = job.progress
        rate = self.curve(job).rate(max(job.replicas_min, 1))
        if pr.total_steps and rate:
            return max((pr.total_steps - pr.step) / rate, 1.0)
        per = max(job.cpu_min * max(job.replicas_min, 1), 1e-9)
        return max(DEFAULT_REMAINING_S, job.attained_service / per)

    def measured(self, job: JobView) -> str:
        """The measured points, as reasons quote them."""
        pts = self.curve(job).points
        if not pts:
            return "nothing measured yet"
        return "steps/s measured by replicas " + ", ".join(f"{k}: {r:.3g}" for k, r in pts)


class ReplicaSizer:
    """`sluice`'s rule, per round: for each elastic CPU job, the replica count that finishes
    it soonest."""

    def __init__(self, name: str, restart_s: float = DEFAULT_RESTART_S, change_margin: float = 0.05) -> None:
        self.name = name
        self.restart_s = restart_s
        """What a resize is assumed to cost the job (checkpoint, stop, relaunch, restore)."""
        self.change_margin = change_margin
        """Another size is taken as this much slower than its curve predicts (hysteresis)."""

    def decide(self, view: ClusterView, ledger: Ledger | None = None) -> list[Resize]:
        units = ReplicaUnits(view, ledger)
        curves = ReplicaCurves()
        out: list[Resize] = []
        for j in sorted(elastic_cpu_jobs(view), key=lambda j: (j.submitted_at, j.id)):
            d = self._one(j, units, curves)
            if d is not None:
                out.append(d)
        return out

    def _one(self, j: JobView, units: ReplicaUnits, curves: ReplicaCurves) -> Resize | None:
        assert j.allocation is not None
        n = held_replicas(j)
        if not curves.settled(j):
            return None  # let the current size be measured first
        curve = curves.curve(j)
        now_rate = curve.rate(n)
        if not now_rate:
            return None
        pr = j.progress
        steps_left = (pr.total_steps - pr.step) if pr.total_steps else None
        if steps_left is not None and steps_left <= 0:
            return None
        left_now = steps_left / now_rate if steps_left is not None else max(DEFAULT_REMAINING_S, j.attained_service)
        work = left_now * now_rate  # steps left, or as many as an unknown job is assumed to need
        best, best_t, best_alloc = n, left_now, None
        cost = restart_s(j, self.restart_s)
        how = "assumed" if restart_measured(j) is None else "measured"
        units.credit(j.allocation)
        for k in range(j.replicas_min, curves.most(j) + 1):
            rate = curve.rate(k)
            if k == n or not rate:
                continue
            t = work / rate * (1.0 + self.change_margin) + cost
            if t >= best_t:
                continue
            alloc = units.take(j, k)
            if alloc is not None:
                units.credit(alloc)
                best, best_t, best_alloc = k, t, alloc
        units.debit(best_alloc or j.allocation)
        if best_alloc is None:
            return None
        return Resize(
            j.id,
            best_alloc,
            f"{self.name}: {n} -> {best} replicas: ~{best_t:.0f}s left instead of ~{left_now:.0f}s "
            f"({curves.measured(j)}; resize cost {cost:.1f}s {how})",
        )
