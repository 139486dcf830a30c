"""`flowcon`: FlowCon's growth-efficiency CPU re-allocation (SEEDS.md §1), as live CPU limits.

Every control interval Δ, per node, for each running job:
  l~ = loss / max loss so far; E_i, E_{i-1} = mean l~ over the last Δ and the Δ before;
  P = |E_i - E_{i-1}| / Δ ;  R = the job's mean share of the node's CPU over the last Δ;
  G = P / R  (growth efficiency).
State: G < α once -> watching; again -> completing; G >= α -> growing.
Limits: growing jobs get min(G_i / ΣG, 1) x cores; completing jobs keep cores / (β n),
β = 1 + 1/n; watching jobs are left as they are; no limit ever goes below a job's guaranteed
`cpu.min` (parts/guarantee.py). When every job on the node is completing,
all limits are lifted and Δ doubles (exponential back-off); Δ resets when a job starts or exits.

Unit of P: Δ is measured in minutes, so P is "normalised loss change per minute" and the
published α = 0.03 separates a job still learning from one that has flattened. (In seconds,
α = 0.03 would call almost every job completing after two intervals.)

Placement of new jobs is Kubernetes' (requests must fit, spread); FlowCon only changes how
CPU is divided among jobs already running. A job with no loss history yet counts as growing
with the best growth efficiency on its node, so a newcomer is never starved.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import StrEnum

from sluice.model import ClusterView, Decision, JobView, Resize
from sluice.policy.kube import place_queued
from sluice.policy.parts.capacity import Ledger
from sluice.policy.parts.guarantee import cpu_limit_within
from sluice.policy.parts.placement import spread

MIN_LIMIT_CORES = 0.1
"""Floor for any limit FlowCon sets, so a job is slowed, never frozen."""


class Growth(StrEnum):
    GROWING = "growing"
    WATCHING = "watching"
    COMPLETING = "completing"


@dataclass(frozen=True)
class Efficiency:
    g: float
    p: float
    r: float


def growth_efficiency(job: JobView, now: float, delta_s: float, node_cpu: float, unit_s: float) -> Efficiency | None:
    """FlowCon's G for one job, or None while it lacks two windows of loss history.

    The windows are Δ long, or longer for a job that reports less often than every Δ/2:
    each window must hold reports, or E would be undefined (a slow reporter would stay a
    "newcomer" for ever). P stays a rate per `unit_s`, so the longer window changes nothing
    else.
    """
    pr = job.progress
    span = max(delta_s, 2.5 * _report_gap(pr.loss_history))
    e_now = pr.mean_loss_between(now - span, now)
    e_prev = pr.mean_loss_between(now - 2 * span, now - span)
    if e_now is None or e_prev is None:
        return None
    p = abs(e_now - e_prev) / (span / unit_s)
    used = pr.mean_usage_between(now - span, now)
    if used is None:
        a = job.allocation.assignments[0] if job.allocation else None
        used = a.cpu_limit if a and a.cpu_limit is not None else (a.cpu_request if a else 1.0)
    r = max(used / node_cpu, 1e-3)
    return Efficiency(p / r, p, r)


def _report_gap(history: tuple[tuple[float, float], ...]) -> float:
    """Median time between a job's recent loss reports (0 with fewer than two)."""
    times = [t for t, _ in history[-16:]]
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return gaps[len(gaps) // 2] if gaps else 0.0


class FlowConPolicy:
    name = "flowcon"

    def __init__(self, interval_s: float = 30.0, alpha: float = 0.03, unit_s: float = 60.0) -> None:
        self.base_interval_s = interval_s
        self.alpha = alpha
        self.unit_s = unit_s
        self._delta = interval_s
        self._last: float | None = None
        self._state: dict[str, Growth] = {}
        self._running: frozenset[str] = frozenset()

    @property
    def interval_s(self) -> float:
        """The current Δ (grows by back-off when every job is completing)."""
        return self._delta

    def decide(self, view: ClusterView) -> list[Decision]:
        out = place_queued(view, Ledger(view), spread, self.name)
        running = frozenset(j.id for j in view.running)
        if running != self._running:
            if self._delta != self.base_interval_s:
                self._delta = self.base_interval_s  # a job started or exited: reset back-off
            self._running = running
            self._state = {k: v for k, v in self._state.items() if k in running}
        if self._last is None:
            self._last = view.now
            return out
        if view.now - self._last < self._delta:
            return out
        self._last = view.now
        all_completing = True
        any_job = False
        for node in view.nodes.values():
            jobs = [j for j in view.jobs_on(node.name) if j.phase.value == "Running"]
            if not jobs:
                continue
            any_job = True
            decisions, node_all_completing = self._reallocate(view, node.name, node.cpu, jobs)
            all_completing = all_completing and node_all_completing
            out.extend(decisions)
        if any_job and all_completing:
            self._delta *= 2
        return out

    def _reallocate(
        self, view: ClusterView, node: str, cores: float, jobs: list[JobView]
    ) -> tuple[list[Decision], bool]:
        n = len(jobs)
        effs: dict[str, Efficiency | None] = {}
        for j in jobs:
            eff = growth_efficiency(j, view.now, self._delta, cores, self.unit_s)
            effs[j.id] = eff
            prev = self._state.get(j.id, Growth.GROWING)
            if eff is None or eff.g >= self.alpha:
                self._state[j.id] = Growth.GROWING
            elif prev == Growth.GROWING:
                self._state[j.id] = Growth.WATCHING
            else:
                self._state[j.id] = Growth.COMPLETING
        states = {j.id: self._state[j.id] for j in jobs}
        if all(s == Growth.COMPLETING for s in states.values()):
            out: list[Decision] = []
            for j in jobs:
                if _limit(j) is not None:
                    out.append(
                        Resize(
                            j.id,
                            j.allocation.with_cpu_limit(None),  # type: ignore[union-attr]
                            f"flowcon: every job on {node} is completing -> all limits lifted, "
                            f"Δ doubles to {self._delta * 2:g}s",
                        )
                    )
            return out, True
        known = [e.g for jid, e in effs.items() if e is not None and states[jid] == Growth.GROWING]
        newcomer_g = max(known) if known else 1.0
        growing = {
            j.id: (effs[j.id].g if effs[j.id] is not None else newcomer_g)  # type: ignore[union-attr]
            for j in jobs
            if states[j.id] == Growth.GROWING
        }
        total_g = sum(growing.values())
        beta = 1.0 + 1.0 / n
        out = []
        for j in jobs:
            state = states[j.id]
            eff = effs[j.id]
            measured = f"G={eff.g:.3f} (P={eff.p:.3f}/min, R={eff.r:.2f})" if eff is not None else "no history yet"
            if state == Growth.WATCHING:
                continue
            if state == Growth.GROWING:
                share = min(growing[j.id] / total_g, 1.0) if total_g > 0 else 1.0 / n
                limit = share * cores
                why = f"growing, {measured}: {share:.0%} of ΣG on {node}"
            else:
                limit = cores / (beta * n)
                why = f"completing, {measured} < α={self.alpha}: keeps 1/(βn) of {node}"
            limit = cpu_limit_within(j, max(limit, MIN_LIMIT_CORES))
            cur = _limit(j)
            if cur is not None and abs(cur - limit) / max(cur, 1e-9) < 0.05:
                continue
            out.append(
                Resize(
                    j.id,
                    j.allocation.with_cpu_limit(limit),  # type: ignore[union-attr]
                    f"flowcon: {why} -> CPU limit {limit:.2f} cores",
                )
            )
        return out, False


def _limit(job: JobView) -> float | None:
    if job.allocation is None or not job.allocation.assignments:
        return None
    return job.allocation.assignments[0].cpu_limit
