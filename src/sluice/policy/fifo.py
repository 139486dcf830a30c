"""`fifo`: strict first-come first-served, no backfill (a plain batch queue).

The job at the head of the queue holds back everyone behind it until it fits — the baseline
that shows what head-of-line blocking costs.
"""

from __future__ import annotations

from sluice.model import ClusterView, Decision
from sluice.policy.parts.ordering import fifo, ready
from sluice.policy.parts.placement import binpack
from sluice.policy.parts.rigid import place_rigid


class FifoPolicy:
    name = "fifo"

    def decide(self, view: ClusterView) -> list[Decision]:
        placeable, _ = ready(view, view.queued)
        return place_rigid(view, fifo(placeable), self.name, binpack, blocking=True)
