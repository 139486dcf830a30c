"""How many replicas a CPU data-parallel job should run with, from its own measured speed.

Why: on CPU the speed-up of more replicas is anything but given — on a 2-core machine two
gloo replicas of the example run at 0.4× of one (docs/benchmarks.md, `bench elastic`),
while on a node with idle cores and a compute-heavy step they can nearly double it. So a
job with `resources.replicas: {min, max}` starts at `min`, and each round this part asks the
job's learned curve (`speedup.LearnedCurve` over replicas, fitted from the steps/s measured
at each size it has run at) whether another size would finish it sooner, counting the
restart a resize costs and a margin against the curve's error. A size never measured is
tried only up to twice the largest measured (the exploration bound), and only where the
replicas fit in the cores free now; it never touches GPU jobs, which the GPU policies size.

It returns decisions and acts on nothing: the controller carries a replica change out as a
checkpointed stop and relaunch at the new size (docs/architecture.md, "Elastic resize").
"""

from __future__ import annotations

from dataclasses import replace

from sluice.model import Allocation, ClusterView, JobView, Phase, Resize
from sluice.policy.parts.capacity import Ledger
from sluice.policy.parts.elastic import DEFAULT_REMAINING_S, DEFAULT_RESTART_S
from sluice.policy.parts.gpu import uses_gpus
from sluice.policy.parts.placement import place_gang, spread
from sluice.policy.parts.speedup import LearnedCurve

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


class ReplicaSizer:
    """Per round: for each elastic CPU job, the replica count that finishes it soonest."""

    def __init__(self, name: str, restart_s: float = DEFAULT_RESTART_S, change_margin: float = 0.05) -> None:
        self.name = name
        self.restart_s = restart_s
        """What a resize is assumed to cost the job (checkpoint, stop, relaunch, restore)."""
        self.change_margin = change_margin
        """Another size is taken as this much slower than its curve predicts (hysteresis)."""

    def decide(self, view: ClusterView, ledger: Ledger | None = None) -> list[Resize]:
        ledger = ledger or Ledger(view)
        out: list[Resize] = []
        for j in sorted(elastic_cpu_jobs(view), key=lambda j: (j.submitted_at, j.id)):
            d = self._one(j, ledger)
            if d is not None:
                out.append(d)
        return out

    def _one(self, j: JobView, ledger: Ledger) -> Resize | None:
        assert j.allocation is not None
        n = len(j.allocation.assignments)
        here = [s for s in j.progress.rates if s.replicas == n and s.gpus == 0]
        if not here or max(s.seconds for s in here) < MIN_MEASURED_S:
            return None  # let the current size be measured first
        curve = LearnedCurve(j.progress.rates, unit="replicas")
        now_rate = curve.rate(n)
        if not now_rate:
            return None
        pr = j.progress
        steps_left = (pr.total_steps - pr.step) if pr.total_steps else None
        if steps_left is not None and steps_left <= 0:
            return None
        left_now = steps_left / now_rate if steps_left is not None else max(DEFAULT_REMAINING_S, j.attained_service)
        work = left_now * now_rate  # steps left, or as many as an unknown job is assumed to need
        top = min(j.replicas_max, curve.explore_cap(j.replicas_min, REPLICA_EXPLORE_FACTOR))
        best, best_t, best_alloc = n, left_now, None
        ledger.credit(j.allocation)
        for k in range(j.replicas_min, top + 1):
            rate = curve.rate(k)
            if k == n or not rate:
                continue
            t = work / rate * (1.0 + self.change_margin) + self.restart_s
            if t >= best_t:
                continue
            alloc = self._fits(j, k, ledger)
            if alloc is not None:
                best, best_t, best_alloc = k, t, alloc
        ledger.debit(best_alloc or j.allocation)
        if best_alloc is None:
            return None
        measured = ", ".join(f"{k}: {r:.3g}" for k, r in curve.points)
        return Resize(
            j.id,
            best_alloc,
            f"{self.name}: {n} -> {best} replicas: ~{best_t:.0f}s left instead of ~{left_now:.0f}s "
            f"(steps/s measured by replicas {measured}; resize cost {self.restart_s:.0f}s counted)",
        )

    def _fits(self, j: JobView, k: int, ledger: Ledger) -> Allocation | None:
        """Where k replicas of the job would go now (the ledger left as it was)."""
        res = place_gang(replace(j, replicas_min=k), ledger, spread)
        if res.allocation is None:
            return None
        ledger.credit(res.allocation)
        return res.allocation
