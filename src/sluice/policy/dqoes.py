"""`dqoes`: quality-of-experience targets for CPU container jobs (DQoES, arXiv 2010.12728).

Each job may state a target: reach a loss by a deadline. Every interval, per node, the
policy estimates when each targeted job will reach its loss at its current speed (a
hyperbolic fit of its loss over time, Optimus-style) and how many cores it needs to make
its deadline; jobs at risk get those cores first (most urgent first), taken from jobs that
are ahead of their targets and from jobs without one, which share what is left. The result
is applied as live CPU limits (Resize), so nothing restarts.

`rest="growth"` shares the leftover cores by FlowCon's growth efficiency instead of equally
(what the `sluice` policy uses for CPU jobs).
"""

from __future__ import annotations

from sluice.model import ClusterView, Decision, JobView, Phase, Resize
from sluice.model.progress import predict_steps_to_loss
from sluice.policy.flowcon import growth_efficiency
from sluice.policy.kube import place_queued
from sluice.policy.parts.capacity import Ledger
from sluice.policy.parts.gpu import uses_gpus
from sluice.policy.parts.guarantee import cpu_limit_within
from sluice.policy.parts.placement import spread

MIN_CORES = 0.1
"""A job is slowed, never frozen."""


def time_to_target(job: JobView, now: float) -> float | None:
    """Seconds until the job's loss reaches its target at today's pace; 0 if reached,
    None when there is no target or too little history."""
    target = job.qoe_loss
    pr = job.progress
    if target is None:
        return None
    if pr.best_loss is not None and pr.best_loss <= target:
        return 0.0
    mx = pr.max_loss or 1.0
    pts = [(t, v * mx) for t, v in pr.loss_history]
    if len(pts) < 5:
        return None
    t_last = pts[-1][0]
    # The fit is generic in its x axis: fed (time, loss) it answers in seconds.
    left = predict_steps_to_loss(pts, target)  # type: ignore[arg-type]
    return None if left is None else max(0.0, left - (now - t_last))


def current_cores(job: JobView, node_cpu: float) -> float:
    u = job.progress.usage_history
    if u:
        recent = [c for _, c in u[-5:]]
        return max(sum(recent) / len(recent), MIN_CORES)
    a = job.allocation.assignments[0] if job.allocation else None
    if a is not None and a.cpu_limit is not None:
        return a.cpu_limit
    return node_cpu / 2


class DQoESPolicy:
    name = "dqoes"

    def __init__(self, interval_s: float = 30.0, rest: str = "equal", name: str = "dqoes") -> None:
        self.interval_s = interval_s
        self.rest = rest
        self.name = name
        self._last: float | None = None

    def decide(self, view: ClusterView) -> list[Decision]:
        return self.decide_cpu(view)

    def decide_cpu(self, view: ClusterView) -> list[Decision]:
        """Place queued CPU jobs (Kubernetes-style) and re-divide cores on every node."""
        cpu_queued = [j for j in view.queued if not uses_gpus(j)]
        out: list[Decision] = []
        if cpu_queued:
            sub = ClusterView(view.now, view.nodes, {j.id: j for j in view.jobs.values() if not uses_gpus(j)})
            out = place_queued(sub, Ledger(sub), spread, self.name)
        if self._last is not None and view.now - self._last < self.interval_s:
            return out
        self._last = view.now
        for node in view.nodes.values():
            jobs = [j for j in view.jobs_on(node.name) if j.phase == Phase.RUNNING and not uses_gpus(j)]
            if jobs:
                out.extend(self._divide(view, node.name, node.cpu, jobs))
        return out

    def _divide(self, view: ClusterView, node: str, cores: float, jobs: list[JobView]) -> list[Decision]:
        need: dict[str, float] = {}
        why: dict[str, str] = {}
        urgency: dict[str, float] = {}
        for j in jobs:
            if j.qoe_loss is None or j.qoe_deadline is None:
                continue
            ttt = time_to_target(j, view.now)
            if ttt is None or ttt == 0.0:
                continue
            have = current_cores(j, cores)
            left = j.qoe_deadline - view.now
            if left <= 0:
                continue  # missed already: no longer worth taking cores from others
            want = min(cores, have * ttt / left * 1.3)
            need[j.id] = max(want, MIN_CORES)
            urgency[j.id] = left - ttt
            why[j.id] = f"QoE: loss {j.qoe_loss:g} in ~{ttt:.0f}s at {have:.2f} cores, {left:.0f}s to deadline"
        limits: dict[str, float] = {}
        room = cores
        for jid in sorted(need, key=lambda k: urgency[k]):
            give = min(need[jid], max(room - MIN_CORES * (len(jobs) - len(limits) - 1), MIN_CORES))
            limits[jid] = give
            room -= give
        rest = [j for j in jobs if j.id not in limits]
        if not rest and limits and room > 0:
            # Nobody to share the leftover with: hand it back to the targeted jobs, so the
            # node is never left idle by the limits.
            total = sum(limits.values())
            limits = {k: v + room * v / total for k, v in limits.items()}
        if rest:
            weights = self._weights(view, rest, cores)
            total_w = sum(weights.values()) or 1.0
            for j in rest:
                limits[j.id] = max(room * weights[j.id] / total_w, MIN_CORES)
                why.setdefault(j.id, f"share of what QoE jobs leave ({self.rest})")
        out: list[Decision] = []
        for j in jobs:
            lim = cpu_limit_within(j, limits[j.id], cores)
            cur = j.allocation.assignments[0].cpu_limit if j.allocation else None
            if cur is not None and abs(cur - lim) / max(cur, 1e-9) < 0.05:
                continue
            if cur is None and lim >= cores * 0.999:
                continue
            out.append(Resize(j.id, j.allocation.with_cpu_limit(lim), f"{self.name}: {why[j.id]} -> {lim:.2f} cores"))  # type: ignore[union-attr]
        return out

    def _weights(self, view: ClusterView, jobs: list[JobView], cores: float) -> dict[str, float]:
        if self.rest != "growth":
            return {j.id: 1.0 for j in jobs}
        out: dict[str, float] = {}
        for j in jobs:
            eff = growth_efficiency(j, view.now, self.interval_s, cores, 60.0)
            out[j.id] = eff.g if eff is not None else 0.0
        best = max(out.values(), default=0.0) or 1.0
        # Newcomers (no history) count as the best grower; a flat job keeps a floor share.
        return {k: max(v if v > 0 else best, 0.1 * best) for k, v in out.items()}
