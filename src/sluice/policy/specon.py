"""`specon`: progress-based speculative migration (SpeCon, arXiv 2010.11307).

Every node's jobs are watched as FlowCon watches them (growth efficiency G = progress /
CPU share). A job whose G stayed below α for two intervals has mostly converged; if its
node is crowded and another node would serve it better, it is migrated there (checkpoint,
stop, resume) to free cores for the fast-growing jobs it leaves behind. New jobs are placed
as ProCon places them: on the node with the least estimated remaining work × jobs.
No CPU limits are set (shares only), as in the paper.
"""

from __future__ import annotations

from sluice.model import Allocation, Assignment, ClusterView, Decision, JobView, Migrate, Phase, Place, Wait
from sluice.policy.flowcon import growth_efficiency
from sluice.policy.parts.gpu import uses_gpus
from sluice.policy.parts.ordering import fifo, ready
from sluice.policy.parts.placement import unschedulable, wait_reason


def remaining_work(job: JobView) -> float:
    """Estimated seconds left (the tracker's prediction, else 1 h for a newcomer)."""
    pr = job.progress.predicted_remaining_s
    return pr if pr is not None else 3600.0


class SpeConPolicy:
    name = "specon"

    def __init__(self, interval_s: float = 30.0, alpha: float = 0.03, unit_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self.alpha = alpha
        self.unit_s = unit_s
        self._slow: dict[str, int] = {}
        self._last: float | None = None
        self._moved: set[str] = set()

    def _load(self, view: ClusterView) -> dict[str, tuple[int, float]]:
        out = {n: (0, 0.0) for n, v in view.nodes.items() if v.schedulable}
        for j in view.jobs.values():
            if j.allocation is None or not j.phase.active or uses_gpus(j):
                continue
            node = j.allocation.primary_node
            if node in out:
                c, w = out[node]
                out[node] = (c + 1, w + remaining_work(j))
        return out

    @staticmethod
    def _score(load: tuple[int, float]) -> float:
        count, work = load
        return (count + 1) * (work + 1.0)

    def decide(self, view: ClusterView) -> list[Decision]:
        out: list[Decision] = []
        load = self._load(view)
        placeable, _ = ready(view, [j for j in view.queued if not uses_gpus(j)])
        for j in fifo(placeable):
            fits = [n for n in load if view.nodes[n].cpu >= j.cpu_min]
            if not fits:
                never = unschedulable(j, view.nodes.values())
                out.append(Wait(j.id, wait_reason("specon", never or "no schedulable node is big enough")))
                continue
            best = min(fits, key=lambda n: (self._score(load[n]), n))
            c, w = load[best]
            load[best] = (c + 1, w + remaining_work(j))
            out.append(
                Place(
                    j.id,
                    Allocation((Assignment(best, j.cpu_min),)),
                    f"specon: least remaining work × jobs on {best} ({c} jobs, {w / 60:.0f} min of work)",
                )
            )
        if self._last is not None and view.now - self._last < self.interval_s:
            return out
        self._last = view.now
        running = [j for j in view.jobs.values() if j.phase == Phase.RUNNING and not uses_gpus(j)]
        self._slow = {k: v for k, v in self._slow.items() if k in view.jobs}
        moved_from: set[str] = set()
        for j in sorted(running, key=lambda j: j.id):
            assert j.allocation is not None
            node = j.allocation.primary_node
            cores = view.nodes[node].cpu if node in view.nodes else 1.0
            eff = growth_efficiency(j, view.now, self.interval_s, cores, self.unit_s)
            if eff is None or eff.g >= self.alpha:
                self._slow[j.id] = 0
                continue
            self._slow[j.id] = self._slow.get(j.id, 0) + 1
            if self._slow[j.id] < 2 or j.id in self._moved or node in moved_from:
                continue
            here = load.get(node, (1, 0.0))
            if here[0] <= 1:
                continue
            others = [n for n in load if n != node and view.nodes[n].cpu >= j.cpu_min]
            if not others:
                continue
            dest = min(others, key=lambda n: (self._score(load[n]), n))
            if self._score(load[dest]) >= self._score((here[0] - 1, here[1] - remaining_work(j))):
                continue
            moved_from.add(node)
            self._moved.add(j.id)
            c, w = load[dest]
            load[dest] = (c + 1, w + remaining_work(j))
            load[node] = (here[0] - 1, here[1] - remaining_work(j))
            out.append(
                Migrate(
                    j.id,
                    Allocation((Assignment(dest, j.cpu_min),)),
                    f"specon: G={eff.g:.3f} < α={self.alpha} twice on crowded {node} ({here[0]} jobs) -> {dest} "
                    f"({c} jobs)",
                )
            )
        return out
