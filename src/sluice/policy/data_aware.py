"""`data-aware`: Kubernetes-style requests, placed where the job's data already is.

Jobs are taken by smallest storage gap (Kang's cooperative placement), jobs sharing a dataset
one after another, and each goes to the node with the best compute fit + cached share of its
data + cache room for the rest. Reasons name the share of data found on the chosen node.
"""

from __future__ import annotations

from sluice.model import ClusterView, Decision, Place, Wait, dataset_of
from sluice.policy.parts.capacity import Ledger
from sluice.policy.parts.data_aware import DataScorer, DataWeights, order_by_storage_gap
from sluice.policy.parts.ordering import backoff_reason, ready
from sluice.policy.parts.placement import place_gang


class DataAwarePolicy:
    name = "data-aware"

    def __init__(self, weights: DataWeights | None = None) -> None:
        self.weights = weights or DataWeights()

    def decide(self, view: ClusterView) -> list[Decision]:
        out: list[Decision] = []
        ledger = Ledger(view)
        scorer = DataScorer(view, self.weights)
        placeable, backing_off = ready(view, view.queued)
        for job in backing_off:
            out.append(Wait(job.id, backoff_reason(job)))
        for job in order_by_storage_gap(view, placeable):
            res = place_gang(job, ledger, scorer)
            if res.allocation is None:
                out.append(Wait(job.id, res.reason))
                continue
            node = res.allocation.primary_node
            share = DataScorer(view, self.weights, scorer.planned).parts(ledger.rooms[node], job)[2]
            for n in res.allocation.nodes:
                scorer.placed(job, n)
            names = ", ".join(dataset_of(d) for d in job.datasets)
            data = f"; {share:.0%} of its data ({names}) is cached or being warmed there" if job.datasets else ""
            out.append(Place(job.id, res.allocation, f"{self.name}: placed on {node}{data}"))
        return out
