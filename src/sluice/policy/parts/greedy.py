"""Handing out units (GPUs) one at a time to whoever gains most from the next one.

Optimus, Pollux-style goodput and sluice's own policy differ only in what a unit is worth
(`gain`); the hand-out is the same marginal-gain greedy, kept here once.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from sluice.model import JobView


def hand_out(
    jobs: Sequence[JobView],
    counts: dict[str, int],
    free: int,
    gain: Callable[[JobView], float],
    take: Callable[[JobView], bool] | None = None,
) -> int:
    """Give `free` units one by one to the job whose next unit gains most, updating `counts`
    in place (`gain` reads `counts`, so it is re-asked after each unit). Returns what is left;
    ties go to the earlier job in `jobs`. `take`, where units are not all alike (CPU replicas
    need room on one node), reserves the job's next unit or says there is none: that job
    then gets no more."""
    heap = [(-g, i, j) for i, j in enumerate(jobs) if (g := gain(j)) > 0]
    heapq.heapify(heap)
    while free > 0 and heap:
        _, i, j = heapq.heappop(heap)
        if take is not None and not take(j):
            continue
        counts[j.id] += 1
        free -= 1
        g = gain(j)
        if g > 0:
            heapq.heappush(heap, (-g, i, j))
    return free
