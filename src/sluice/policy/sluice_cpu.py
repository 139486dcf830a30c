"""The CPU half of `sluice`: shortest-remaining-work first through kernel CPU *weights*.

Kernel weights (cgroup `cpu.shares` / `cpu.weight`, the job's CPU *request*) never withhold
an idle core: a job takes what it can use, and only under contention do weights decide who
gets the cores. So `sluice` never sets a CPU limit; each round, on each node, it re-divides
the requests of the jobs running there so that the cores go where they finish work soonest:

1. **Demand, learned from usage.** Under the kernel's weighted fair share a job gets
   min(what it can use, its weighted share). A job that used clearly less than it was
   offered (or any job on a node with idle cores) showed how much it can use: its *demand*.
   A job that used all it was offered may want more: its demand is unknown (at least what it
   used). Nothing here needs the simulator's truth: usage is what a real engine samples.
2. **Remaining work at full speed.** A job's remaining steps (its declared `total_steps`
   minus its step) at its measured steps per core-second, spread over its demand: the time
   it would need if it got every core it can use. Jobs without a declared length rank after
   those with one (`unknown_s`); a QoE deadline at risk ranks first.
3. **Targets.** Every job first gets its guaranteed `cpu.min`; the cores left go in that
   order, each job up to its demand (shortest first: SRPT, the average-JCT optimum for jobs
   that cannot use more than their demand); a job of unknown demand takes what is left.
4. **Weights from targets.** Each job's request becomes its target's share of the node's
   total request (conserved, so admission sees the node exactly as full as before), so
   under contention each job gets at least its target and never less than its `cpu.min`;
   whatever a job does not use flows to the others (work-conserving).
5. **Placement.** A new job goes to the node with the most cores nobody is predicted to use
   (node cores minus the running jobs' learned demands), among the nodes where its request
   fits, instead of the least-requested node.

Measured in docs/policies.md ("CPU jobs") against `kube`, with what each step buys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.model import Allocation, Assignment, ClusterView, Decision, JobView, Migrate, Phase, Place, Resize, Wait
from sluice.policy.dqoes import time_to_target
from sluice.policy.parts.capacity import Ledger, NodeRoom
from sluice.policy.parts.ordering import backoff_reason, fifo, ready
from sluice.policy.parts.placement import place_gang, spread

USED_ALL = 0.9
"""A job that used at least this share of what it was offered may want more."""


@dataclass(frozen=True, slots=True)
class Demand:
    """Cores a job can use: `cores` is exact when `known`, else a lower bound."""

    cores: float
    known: bool


class CpuShares:
    """Per-node CPU weights for CPU-only jobs, and their placement; state: learned demands."""

    def __init__(
        self,
        name: str = "sluice",
        interval_s: float = 10.0,
        hysteresis: float = 0.1,
        deadline_slack: float = 1.2,
        unknown_s: float = 3600.0,
        placement: str = "free",
        reweigh: bool = True,
        migrate: bool = True,
        min_gain_s: float = 120.0,
        protect_longest: float = 1.0,
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.hysteresis = hysteresis
        self.deadline_slack = deadline_slack
        self.unknown_s = unknown_s
        self.placement = placement
        self.reweigh = reweigh
        self.migrate = migrate
        self.min_gain_s = min_gain_s
        self._moved: set[str] = set()
        self.protect_longest = protect_longest
        self._last: float | None = None
        self._demand: dict[str, Demand] = {}

    # -- what the jobs showed -------------------------------------------------------------

    def _learn(self, node_cpu: float, jobs: list[JobView]) -> None:
        """Update each job's demand from its usage over the last interval and what it was offered."""
        used = {j.id: _recent_usage(j, self.interval_s) for j in jobs}
        if any(u is None for u in used.values()):
            for j in jobs:
                if used[j.id] is not None:
                    self._note(j.id, used[j.id] or 0.0, known=False)
            return
        total_used = sum(u or 0.0 for u in used.values())
        spare = node_cpu - total_used > 0.05 * node_cpu
        weights = {j.id: j.allocation.total_cpu_request if j.allocation else 1.0 for j in jobs}
        sw = sum(weights.values()) or 1.0
        for j in jobs:
            u = used[j.id] or 0.0
            offered = node_cpu * weights[j.id] / sw
            # Water-filling: a job below its weighted share was capped by itself, not by others.
            self._note(j.id, u, known=spare or u < USED_ALL * offered)

    def _note(self, job_id: str, used: float, known: bool) -> None:
        old = self._demand.get(job_id)
        if known:
            cores = max(used, old.cores) if old is not None and old.known else used
            self._demand[job_id] = Demand(cores, True)
        elif old is None or (not old.known and used > old.cores):
            self._demand[job_id] = Demand(used, False)
        elif old.known and used > old.cores * 1.05:
            self._demand[job_id] = Demand(used, False)  # it took more than we thought it could

    def demand(self, job: JobView, node_cpu: float) -> Demand:
        d = self._demand.get(job.id)
        cap = job.cpu_max if job.cpu_max is not None else node_cpu
        if d is None:
            return Demand(cap, False)
        return Demand(min(max(d.cores, job.cpu_min), cap), d.known)

    def remaining_s(self, job: JobView, demand: float) -> float | None:
        """Seconds to finish if the job got `demand` cores, from its own reports (None: unknown)."""
        pr = job.progress
        if pr.total_steps is None or pr.throughput <= 0:
            return pr.predicted_remaining_s
        left = max(0, pr.total_steps - pr.step)
        used = _recent_usage(job, 3 * self.interval_s)
        if not used:
            return pr.predicted_remaining_s
        per_core = pr.throughput / used
        return left / (per_core * max(demand, used))

    # -- the round ------------------------------------------------------------------------

    def decide(self, view: ClusterView) -> list[Decision]:
        """`view` holds only CPU-only jobs."""
        out = self._place(view) if view.queued else []
        if self._last is not None and view.now - self._last < self.interval_s - 1e-9:
            return out
        self._last = view.now
        live = {j.id for j in view.jobs.values() if j.phase.active}
        self._demand = {k: v for k, v in self._demand.items() if k in live}
        per_node: dict[str, list[JobView]] = {}
        for node in view.nodes.values():
            jobs = [
                j
                for j in view.jobs_on(node.name)
                if j.phase == Phase.RUNNING and j.allocation is not None and len(j.allocation.assignments) == 1
            ]
            self._learn(node.cpu, jobs)
            per_node[node.name] = jobs
        moved: set[str] = set()
        if self.migrate and view.capabilities.migration:
            moves = self._moves(view, per_node)
            out.extend(moves)
            moved = {d.job_id for d in moves}
        for node in view.nodes.values():
            jobs = [j for j in per_node[node.name] if j.id not in moved]
            if len(jobs) >= 2 and self.reweigh:
                out.extend(self._weigh(view, node.name, node.cpu, jobs))
        return out

    def _moves(self, view: ClusterView, per_node: dict[str, list[JobView]]) -> list[Decision]:
        """At most one job per crowded node moves, once in its life, to a node with room for all
        it can use: a node is crowded when its jobs' learned demands exceed its cores. The job
        moved is the one whose demand fits elsewhere and that loses the least to contention
        relative to its restart (its remaining time must be at least `min_gain_s`)."""
        unclaimed = {
            name: n.cpu - sum(self.demand(j, n.cpu).cores for j in view.jobs_on(name) if j.phase.active)
            for name, n in view.nodes.items()
            if n.schedulable
        }
        out: list[Decision] = []
        for name, jobs in per_node.items():
            cores = view.nodes[name].cpu
            over = -unclaimed.get(name, 0.0) if name in unclaimed else sum(self.demand(j, cores).cores for j in jobs)
            if over <= 0.5:
                continue
            best: tuple[float, JobView, str] | None = None
            for j in jobs:
                d = self.demand(j, cores)
                if not d.known or j.id in self._moved:
                    continue
                left = self.remaining_s(j, d.cores)
                if left is None or left < self.min_gain_s:
                    continue
                for dest, room in unclaimed.items():
                    if dest == name or room < d.cores or view.nodes[dest].cpu < j.cpu_min:
                        continue
                    score = min(d.cores, over) - 1e-6 * left  # relieves the most, then the shortest
                    if best is None or score > best[0]:
                        best = (score, j, dest)
            if best is None:
                continue
            _, j, dest = best
            d = self.demand(j, cores)
            unclaimed[dest] -= d.cores
            unclaimed[name] = unclaimed.get(name, 0.0) + d.cores
            self._moved.add(j.id)
            out.append(
                Migrate(
                    j.id,
                    Allocation((Assignment(dest, j.cpu_min),)),
                    f"{self.name}: {name} is crowded (its jobs can use {over:.1f} cores more than it has); "
                    f"{dest} has {unclaimed[dest] + d.cores:.1f} unclaimed cores for the {d.cores:.1f} this job uses",
                )
            )
        return out

    def _weigh(self, view: ClusterView, node: str, cores: float, jobs: list[JobView]) -> list[Decision]:
        dem = {j.id: self.demand(j, cores) for j in jobs}
        why: dict[str, str] = {}

        def key(j: JobView) -> tuple[int, float, float, str]:
            left = self.remaining_s(j, dem[j.id].cores)
            why[j.id] = f"~{left:.0f}s left at {dem[j.id].cores:.1f} cores" if left is not None else "length unknown"
            urgent = 0
            ttt = time_to_target(j, view.now)
            if j.qoe_deadline is not None and ttt and view.now + ttt * self.deadline_slack > j.qoe_deadline:
                urgent = -1
                why[j.id] += ", QoE deadline at risk"
            return (urgent, self.unknown_s if left is None else left, j.submitted_at, j.id)

        order = sorted(jobs, key=key)
        target = {j.id: j.cpu_min for j in jobs}
        if self.protect_longest > 0 and len(order) > 1:
            # The job with the most work left sets the makespan: it keeps `protect_longest` of
            # what an equal split would give it, so SRPT does not stretch the schedule's end.
            last = order[-1]
            fair = self.protect_longest * cores / len(jobs)
            want = dem[last.id].cores if dem[last.id].known else cores
            target[last.id] = max(target[last.id], min(fair, want))
        slack = cores - sum(target.values())
        for j in order:
            if slack <= 1e-9:
                break
            want = dem[j.id].cores if dem[j.id].known else cores
            add = min(slack, max(0.0, want - target[j.id]))
            target[j.id] += add
            slack -= add
        if slack > 1e-9:  # every demand met: the rest is nobody's to fight over
            for j in jobs:
                target[j.id] += slack / len(jobs)
        total_req = sum(j.allocation.total_cpu_request for j in jobs if j.allocation is not None)
        st = sum(target.values())
        out: list[Decision] = []
        for j in jobs:
            assert j.allocation is not None
            req = round(total_req * target[j.id] / st, 3)
            cur = j.allocation.total_cpu_request
            if abs(cur - req) / max(cur, 1e-9) < self.hysteresis:
                continue
            a = j.allocation.assignments[0]
            alloc = Allocation((Assignment(a.node, req, a.cpu_limit, a.gpus),))
            out.append(
                Resize(
                    j.id,
                    alloc,
                    f"{self.name}: CPU weight {req:.2f} of {total_req:.2f} on {node}, "
                    f"≥{target[j.id]:.2f} of {cores:g} cores under contention ({why[j.id]})",
                )
            )
        return out

    def _place(self, view: ClusterView) -> list[Decision]:
        """Queued jobs in FIFO order, each on the node with the most unclaimed cores it fits."""
        ledger = Ledger(view)
        free: dict[str, float] = {}
        known = [d.cores for d in self._demand.values() if d.known]
        guess = sorted(known)[len(known) // 2] if known else 1.0  # a new job: the median demand seen
        for name, n in view.nodes.items():
            claimed = sum(
                self.demand(j, n.cpu).cores for j in view.jobs_on(name) if j.phase.active and j.allocation is not None
            )
            free[name] = n.cpu - claimed

        def score(room: NodeRoom, job: JobView) -> float:
            if self.placement == "spread":
                return spread(room, job)
            return free.get(room.name, 0.0) - 1e-3 * room.cpu_used_fraction

        out: list[Decision] = []
        placeable, backing_off = ready(view, view.queued)
        out.extend(Wait(j.id, backoff_reason(j)) for j in backing_off)
        for job in fifo(placeable):
            res = place_gang(job, ledger, score)
            if res.allocation is None:
                out.append(Wait(job.id, res.reason))
                continue
            for a in res.allocation.assignments:
                free[a.node] = free.get(a.node, 0.0) - max(guess, a.cpu_request)
            nodes = ", ".join(res.allocation.nodes)
            out.append(
                Place(
                    job.id,
                    res.allocation,
                    f"{self.name}: on {nodes}, the node with the most cores no running job is using "
                    f"({job.cpu_min:g} CPU requested, no CPU limit — shares only)",
                )
            )
        return out


def _recent_usage(job: JobView, window_s: float) -> float | None:
    """Mean cores used over the last `window_s` of samples (None before the first sample)."""
    u = job.progress.usage_history
    if not u:
        return None
    t_end = u[-1][0]
    vals = [c for t, c in u if t > t_end - window_s] or [u[-1][1]]
    m = sum(vals) / len(vals)
    return m if math.isfinite(m) else None
