"""`binpack`: place every job that fits at its requested size on the fullest node that has
room (GPU jobs on as few nodes as possible), skipping over jobs that do not fit (backfill).
Keeps whole nodes free for large jobs; never preempts, never resizes."""

from __future__ import annotations

from sluice.model import ClusterView, Decision
from sluice.policy.parts.ordering import fifo, ready
from sluice.policy.parts.placement import binpack
from sluice.policy.parts.rigid import place_rigid


class BinpackPolicy:
    name = "binpack"

    def decide(self, view: ClusterView) -> list[Decision]:
        placeable, _ = ready(view, view.queued)
        return place_rigid(view, fifo(placeable), self.name, binpack, blocking=False)
