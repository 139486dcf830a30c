"""`optimus`: remaining-time greedy allocation (Optimus, EuroSys'18, as in the Pollux artifact's
"Optimus+Oracle").

Every job that can gets one GPU (oldest first); then each spare GPU goes to the job whose
predicted remaining time falls the most with one more GPU. The batch size stays the user's
(no statistical-efficiency adaptation); jobs are re-sized whenever their share changes,
paying the restart each time — which is what the published comparison measured.
"""

from __future__ import annotations

from sluice.model import ClusterView, Decision, JobView, Phase
from sluice.policy.parts.elastic import Speedups, apply_targets
from sluice.policy.parts.gpu import GpuLedger, uses_gpus
from sluice.policy.parts.greedy import hand_out
from sluice.policy.parts.ordering import ready


class OptimusPolicy:
    name = "optimus"

    def __init__(self, learn_speedup: bool = True) -> None:
        self.learn_speedup = learn_speedup
        """Learn each job's speed-up curve from its measured rates (else the n^0.8 prior)."""

    def decide(self, view: ClusterView) -> list[Decision]:
        queued, _ = ready(view, view.queued)
        jobs = [j for j in view.jobs.values() if j.phase in (Phase.STARTING, Phase.RUNNING)] + queued
        jobs = sorted((j for j in jobs if uses_gpus(j)), key=lambda j: (j.submitted_at, j.id))
        ledger = GpuLedger(view)
        total = sum(ledger.capacity.values())
        sp = Speedups(ledger.per_node, learn=self.learn_speedup)
        rem = {j.id: sp.remaining_ref_s(j) for j in jobs}
        n: dict[str, int] = {}
        free = total
        for j in jobs:
            n[j.id] = 1 if free >= 1 else 0
            free -= n[j.id]

        def gain(j: JobView) -> float:
            k = n[j.id]
            if k == 0 or k + 1 > sp.most(j):
                return 0.0
            return rem[j.id] / sp(j, k) - rem[j.id] / sp(j, k + 1)

        hand_out(jobs, n, free, gain)

        def why(j: JobView, k: int) -> str:
            if k == 0:
                return "no GPU left after one each for older jobs"
            return f"predicted remaining {rem[j.id] / sp(j, k) / 3600:.2f} h on {k} GPUs"

        return apply_targets(view, jobs, n, self.name, why, ledger)
