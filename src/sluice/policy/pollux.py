"""`pollux`: goodput-driven elastic allocation in the spirit of Pollux (OSDI'21).

Jobs adapt their batch size to their GPUs (the driver runs them AdaptDL-style, hence
`adaptive_batch`), so a GPU is worth what it adds to a job's *goodput* — throughput times
statistical efficiency — as `elastic.Speedups` estimates it (the true curve only in an
oracle study). Pollux maximises a generalised mean of the jobs' speedups with p = -1, i.e.
minimises Σ 1/speedup: that first gives every job one GPU (oldest first), then hands each
spare GPU to the job whose 1/speedup falls most.
A change of allocation costs the job its restart, so a running job's speedup under any other
allocation is discounted by the restart time against its remaining time.

Pollux searches allocations with a genetic algorithm over exact placements; this greedy
over consolidated GPU counts is the simplification (documented in docs/policies.md).
"""

from __future__ import annotations

from sluice.model import ClusterView, Decision, JobView, Phase
from sluice.policy.parts.elastic import Speedups, apply_targets, restart_s
from sluice.policy.parts.gpu import GpuLedger, held_gpus, uses_gpus
from sluice.policy.parts.greedy import hand_out
from sluice.policy.parts.ordering import ready


class PolluxPolicy:
    name = "pollux"
    adaptive_batch = True

    def __init__(self, p: float = -1.0, learn_speedup: bool = True) -> None:
        if p >= 0:
            raise ValueError(f"p must be negative (a fairness-leaning mean), got {p}")
        self.p = p
        self.learn_speedup = learn_speedup
        """Learn each job's goodput curve from its measured rates (else the n^0.8 prior)."""

    def decide(self, view: ClusterView) -> list[Decision]:
        queued, _ = ready(view, view.queued)
        jobs = [j for j in view.jobs.values() if j.phase in (Phase.STARTING, Phase.RUNNING)] + queued
        jobs = sorted((j for j in jobs if uses_gpus(j)), key=lambda j: (j.submitted_at, j.id))
        ledger = GpuLedger(view)
        free = sum(ledger.capacity.values())
        sp = Speedups(ledger.per_node, learn=self.learn_speedup)
        rem = {j.id: sp.remaining_ref_s(j) for j in jobs}

        def eff(j: JobView, k: int) -> float:
            """Speedup at k GPUs, counting the restart a change would cost."""
            s = sp(j, k)
            if k == 0 or k == held_gpus(j):
                return s
            r = rem[j.id]
            return r / (r / s + restart_s(j))

        n: dict[str, int] = {}
        for j in jobs:
            n[j.id] = 1 if free >= 1 else 0
            free -= n[j.id]

        def gain(j: JobView) -> float:
            k = n[j.id]
            if k == 0 or k + 1 > sp.most(j):
                return 0.0
            return eff(j, k) ** self.p - eff(j, k + 1) ** self.p

        hand_out(jobs, n, free, gain)

        def why(j: JobView, k: int) -> str:
            if k == 0:
                return "every GPU already serves an older job"
            return f"speedup {sp(j, k):.2f}× on {k} GPUs"

        return apply_targets(view, jobs, n, self.name, why, ledger)
