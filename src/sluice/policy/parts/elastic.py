"""Elastic GPU allocation: what a job gains from more GPUs, and turning per-job GPU counts
into the fewest decisions (keep, resize in place, preempt, place) that are each feasible in
the order the controller executes them.

What a job gains and how long it has left are *estimates* from what a real engine observes:
the job's own reports (declared total steps, measured throughput) and a default sub-linear
scaling model. Only in an explicit oracle study (`JobView.oracle`, the simulator's ground
truth) are they exact; that gives upper bounds, not results a real cluster could reach.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from sluice.model import Allocation, Assignment, ClusterView, Decision, JobView, Phase, Place, Preempt, Resize, Wait
from sluice.policy.parts.gpu import GpuLedger, held_gpus, max_gpus, requested_gpus
from sluice.policy.parts.placement import unschedulable, wait_reason
from sluice.policy.parts.speedup import PRIOR_EXPONENT, LearnedCurve
from sluice.policy.parts.units import GpuUnits, Units

DEFAULT_REMAINING_S = 3600.0
"""What a job with no estimate of its remaining time is assumed to need."""

DEFAULT_RESTART_S = 30.0
"""What a restart (or change of GPUs) is assumed to cost a job until one of its own restarts
has been measured (`ProgressSignals.restart_lost_s`): checkpoint, relaunch, restore. The
simulator's GPU jobs charge exactly this much; a CPU data-parallel job on the local engine
loses about 2-6 s (`sluice bench elastic`)."""

SCALING_EXPONENT = PRIOR_EXPONENT
"""The prior goodput model where a job has not been measured (see `speedup.LearnedCurve`)."""


def shape(n: int, per_node: int) -> tuple[int, ...]:
    """The consolidated placement of n GPUs: whole nodes, then the rest."""
    out: list[int] = []
    while n > 0 and per_node > 0:
        out.append(min(n, per_node))
        n -= out[-1]
    return tuple(out)


class Speedups:
    """Memoised relative goodput of each job at n consolidated GPUs (0 GPUs -> 0), and what
    follows from it: remaining time at the reference allocation and the most GPUs worth trying.

    Outside an oracle study each job's curve is learned from its own measured rates
    (`speedup.LearnedCurve`); in one, the simulator's true curve is used.
    """

    def __init__(self, per_node: int, learn: bool = True, carry_noise: bool = False) -> None:
        self.per_node = max(per_node, 1)
        self.learn = learn
        """False: every job gets the prior curve and may use its spec's maximum at once (the
        fixed model used before curves were learned; kept as a baseline)."""
        self.carry_noise = carry_noise
        """Carry each measured rate to the job's current gradient noise scale, when it reports
        one (`speedup.noise_factor`). Off for the policies without hysteresis: the moving
        estimates made `pollux` and `optimus` resize more and finish later (docs/policies.md)."""
        self._memo: dict[tuple[str, int], float] = {}
        self._curves: dict[str, LearnedCurve] = {}

    def curve(self, job: JobView) -> LearnedCurve:
        c = self._curves.get(job.id)
        if c is None:
            c = self._curves[job.id] = LearnedCurve(
                job.progress.rates if self.learn else (),
                noise_now=job.progress.noise_scale if self.carry_noise else None,
                ref_batch=job.progress.ref_batch,
                total_steps=job.progress.total_steps,
            )
        return c

    def __call__(self, job: JobView, n: int) -> float:
        if n <= 0:
            return 0.0
        key = (job.id, n)
        v = self._memo.get(key)
        if v is None:
            truth = job.oracle.speedup if job.oracle is not None else None
            if truth is not None:
                alloc = Allocation(tuple(Assignment(f"_{i}", gpus=g) for i, g in enumerate(shape(n, self.per_node))))
                v = max(truth(alloc), 1e-9)
            else:
                v = self.curve(job).speedup(n, ref_gpus(job))
            self._memo[key] = v
        return v

    def least(self, job: JobView) -> int:
        """Every GPU job is first given one GPU (Pollux and Optimus both start there)."""
        return 1

    def most(self, job: JobView) -> int:
        """Most GPUs a policy may give the job: the spec's maximum, and outside an oracle
        study no more than the learned curve is confident to try."""
        if job.oracle is not None or not self.learn:
            return max_gpus(job)
        return min(max_gpus(job), self.curve(job).explore_cap(requested_gpus(job)))

    def remaining_ref_s(self, job: JobView) -> float:
        """Seconds left at the job's reference allocation.

        The oracle's exact figure in an oracle study; else the steps left (declared total −
        reported step) at the learned curve's speed on the reference GPUs; else the
        progress tracker's prediction at the GPUs held (e.g. from a loss-curve fit to the QoE
        target), converted with the curve; else unknown: the attained service at the
        reference allocation, at least DEFAULT_REMAINING_S.
        """
        if job.oracle is not None:
            return max(job.oracle.remaining_ref_s, 1.0)
        pr = job.progress
        rate = self.curve(job).rate(ref_gpus(job))
        if pr.total_steps and rate:
            return max((pr.total_steps - pr.step) / rate, 1.0)
        if pr.predicted_remaining_s is not None:
            held = held_gpus(job)
            return max(pr.predicted_remaining_s * self(job, held) if held else pr.predicted_remaining_s, 1.0)
        # Unknown length: as Tiresias does, take the service already attained as the sign of
        # a long job (job lengths are heavy-tailed), never less than the default.
        return max(DEFAULT_REMAINING_S, job.attained_service / ref_gpus(job))


def ref_gpus(job: JobView) -> int:
    """The reference allocation speedups are relative to: the oracle's, else what the job asked for."""
    if job.oracle is not None:
        return max(job.oracle.ref_gpus, 1)
    return max(requested_gpus(job), 1)


def remaining_ref_s(job: JobView, per_node: int = 1) -> float:
    """`Speedups.remaining_ref_s` for one job (see there)."""
    return Speedups(per_node).remaining_ref_s(job)


def restart_s(job: JobView, default: float = DEFAULT_RESTART_S) -> float:
    """What a change of allocation costs the job: the oracle's exact figure in an oracle
    study; else the median of what the job's own deliberate restarts measurably cost it
    (robust to one restart that waited on something else); else `default`, assumed."""
    if job.oracle is not None and job.oracle.restart_s is not None:
        return job.oracle.restart_s
    measured = restart_measured(job)
    return default if measured is None else measured


def restart_measured(job: JobView) -> float | None:
    """The median measured cost of the job's recent deliberate restarts; None before any."""
    lost = job.progress.restart_lost_s
    return statistics.median(lost) if lost else None


def apply_targets(
    view: ClusterView,
    jobs: list[JobView],
    targets: dict[str, int],
    policy: str,
    why: Callable[[JobView, int], str],
    ledger: GpuLedger | Units | None = None,
) -> list[Decision]:
    """Decisions that move each job in `jobs` to its target count of units (GPUs unless
    `ledger` is another `units.Units`, e.g. CPU replicas).

    Planned against the units free now, in the controller's execution order — preemptions,
    then shrinks, then grows, then placements — so each one is feasible when it runs; a grow
    that cannot find room keeps the job as it is, a placement that cannot waits.
    """
    units = GpuUnits(view, ledger) if ledger is None or isinstance(ledger, GpuLedger) else ledger
    u = units.unit
    out: list[Decision] = []
    running = [j for j in jobs if j.phase in (Phase.STARTING, Phase.RUNNING) and j.allocation is not None]
    queued = [j for j in jobs if j.phase == Phase.QUEUED]
    for j in running:
        if targets.get(j.id, 0) == 0:
            assert j.allocation is not None
            units.credit(j.allocation)
            out.append(Preempt(j.id, f"{policy}: {why(j, 0)}"))
    shrink = [j for j in running if 0 < targets.get(j.id, 0) < units.held(j)]
    grow = [j for j in running if targets.get(j.id, 0) > units.held(j)]
    for j in shrink + sorted(grow, key=lambda j: -targets[j.id]):
        n = targets[j.id]
        assert j.allocation is not None
        units.credit(j.allocation)
        alloc = units.take(j, n, keep=j.allocation)
        if alloc is None:
            units.debit(j.allocation)
            continue
        out.append(Resize(j.id, alloc, f"{policy}: {units.held(j)} -> {n} {u} ({why(j, n)})"))
    for j in sorted(queued, key=lambda j: -targets.get(j.id, 0)):
        n = targets.get(j.id, 0)
        never = unschedulable(j, view.nodes.values(), per_replica=units.per_replica)
        if never:
            out.append(Wait(j.id, wait_reason(policy, never)))
            continue
        if n <= 0:
            out.append(Wait(j.id, f"{policy}: {why(j, 0)}"))
            continue
        alloc = units.take(j, n)
        if alloc is None:
            out.append(Wait(j.id, f"{policy}: {n} {u} chosen but not free yet ({why(j, n)})"))
            continue
        out.append(Place(j.id, alloc, f"{policy}: {n} {u} on {units.where(alloc)} ({why(j, n)})"))
    return out
