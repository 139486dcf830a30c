"""`kube`: what Kubernetes does, as the baseline every other policy is measured against.

CPU requests become kernel CPU shares (weights) with no limit; placement spreads over the
least-requested node; the queue is priority-then-FIFO and a job that does not fit is
skipped (kube-scheduler keeps trying the others); nothing looks at training progress.
"""

from __future__ import annotations

from sluice.model import ClusterView, Decision, Place, Wait
from sluice.policy.parts.capacity import Ledger
from sluice.policy.parts.ordering import backoff_reason, fifo, ready
from sluice.policy.parts.placement import NodeScore, place_gang, spread


def place_queued(view: ClusterView, ledger: Ledger, score: NodeScore, policy: str) -> list[Decision]:
    """Place every queued job that fits, in FIFO order; the rest wait with a reason."""
    out: list[Decision] = []
    placeable, backing_off = ready(view, view.queued)
    for job in backing_off:
        out.append(Wait(job.id, backoff_reason(job)))
    for job in fifo(placeable):
        res = place_gang(job, ledger, score)
        if res.allocation is None:
            out.append(Wait(job.id, res.reason))
            continue
        nodes = ", ".join(res.allocation.nodes)
        out.append(
            Place(
                job.id,
                res.allocation,
                f"{policy}: fits on {nodes} ({job.cpu_min:g} CPU requested, no CPU limit — shares only)",
            )
        )
    return out


class KubePolicy:
    name = "kube"

    def decide(self, view: ClusterView) -> list[Decision]:
        return place_queued(view, Ledger(view), spread, self.name)
