"""`sluice`: our policy. It combines what the others each know one piece of:

- **predicted remaining time** (Optimus, SRPT): the first GPU goes to the jobs that will
  finish soonest, so short jobs are not stuck behind long ones (Tiresias only guesses this
  from attained service);
- **goodput** (Pollux): jobs adapt their batch size, and a GPU is worth the goodput it adds;
- **restart cost**: every change of a running job's allocation costs its restart, so a change
  must save more time than it costs, and running jobs keep their place unless a waiting job
  is much shorter (`preempt_ratio`);
- **QoE targets** (DQoES): a job whose deadline is at risk jumps the queue;
- **GPU-time as a price**: spare GPUs go greedily to the job whose completion time falls the
  most, minus what the extra GPU-seconds cost the jobs still waiting (zero when none wait),
  judged per GPU over a step to one more GPU or to a larger count the job was measured at
  (goodput often dips at a node boundary and rises beyond: `lookahead`).

CPU-only jobs get the same idea through kernel CPU weights (`sluice_cpu.CpuShares`):
shortest remaining work first up to what each job can use, QoE deadlines at risk first,
never below `cpu.min`, work-conserving (no limits).
The design and its measurements are in docs/policies.md.
"""

from __future__ import annotations

from sluice.model import ClusterView, Decision, JobView, Phase
from sluice.policy.parts.elastic import Speedups, apply_targets, restart_s
from sluice.policy.parts.gpu import GpuLedger, held_gpus, uses_gpus
from sluice.policy.parts.greedy import hand_out
from sluice.policy.parts.ordering import ready
from sluice.policy.parts.replicas import ReplicaSizer
from sluice.policy.sluice_cpu import CpuShares

LOOKAHEADS = ("measured", "all", "none")


class SluicePolicy:
    name = "sluice"
    resizes_replicas = True
    """Sizes a job within its `resources.replicas` range (the controller says so of a policy
    that does not)."""
    adaptive_batch = True

    def __init__(
        self,
        preempt_ratio: float = 2.0,
        deadline_slack: float = 1.2,
        queue_price: float = 1.0,
        alpha: float = 2.0,
        change_margin: float = 0.05,
        busy_fraction: float = 0.7,
        learn_speedup: bool = True,
        carry_noise: bool = False,
        lookahead: str = "measured",
        weight_at_held: bool = True,
    ) -> None:
        if not 0.0 <= busy_fraction <= 1.0:
            raise ValueError(f"busy_fraction must be within [0, 1], got {busy_fraction}")
        if lookahead not in LOOKAHEADS:
            raise ValueError(f"lookahead must be one of {', '.join(LOOKAHEADS)}, got {lookahead!r}")
        self.alpha = alpha
        self.change_margin = change_margin
        """A running job's other allocations are taken as this much slower than predicted
        (besides the restart): hysteresis against churn on a model's small errors."""
        self.busy_fraction = busy_fraction
        """The GPU hysteresis applies only once at least this share of the GPUs is held: on a
        cluster with idle GPUs a change takes nothing from anyone, and a wrong guess costs the
        job one restart, so exploring is cheaper than waiting (0.5x load: 2 -> 4 of 8 workloads
        at <= 0.9x pollux; see docs/policies.md)."""
        self.learn_speedup = learn_speedup
        """Learn each job's goodput curve from its measured rates (else the n^0.8 prior)."""
        self.carry_noise = bool(carry_noise)
        """Carry measured rates to the job's current gradient noise scale when it reports one
        (`speedup.noise_factor`). Off: its gain in the simulator (1-2 % mean JCT with the exact
        noise scale) did not survive a realistic error on the estimate (docs/policies.md, "The
        gradient noise scale"); the `sluice-gns` row of `sluice bench sim` runs it on."""
        self.lookahead = lookahead
        """Which larger GPU counts a job's next GPU is judged against (besides one more):
        "measured" — the counts its curve was measured at, so a job can be moved past a dip
        it has seen (goodput often falls at a node boundary and rises beyond it) but never
        on an extrapolation (in an oracle study, where the curve is exact, every count);
        "all" — every count up to `Speedups.most`, which only an exact curve can afford;
        "none" — one more GPU only (before 2026-11-26).
        See docs/policies.md, "Looking past a dip"."""
        self.weight_at_held = bool(weight_at_held)
        """Weigh a running job's GPUs below what it holds by its time at what it holds (its
        size this round), not by its time at the smaller count being judged: without it a job
        looks longer the more of its GPUs are taken, so a long job, once shrunk, loses the rest
        (w3 at 1.5x: 0.939 -> 0.890 of pollux, restarts -8 to -16 % at every load; on by
        default since 2026-11-26; at 0.5x it costs w5 2-3 %: docs/policies.md, "Weighing a
        running job at what it holds")."""
        self.preempt_ratio = preempt_ratio
        self.deadline_slack = deadline_slack
        self.queue_price = queue_price
        self.cpu = CpuShares(self.name, deadline_slack=deadline_slack)
        self.replicas = ReplicaSizer(self.name, change_margin=change_margin)

    def decide(self, view: ClusterView) -> list[Decision]:
        out = self._gpu(view)
        if any(not uses_gpus(j) for j in view.jobs.values()):
            out.extend(self._cpu(view))
        return out

    def _cpu(self, view: ClusterView) -> list[Decision]:
        """CPU-only jobs: kernel weights towards the least remaining work (policy/sluice_cpu.py);
        an elastic data-parallel job's replica count from its measured speed (parts/replicas.py),
        which takes precedence over a weight change for the same job in the same round."""
        sub = ClusterView(
            view.now, view.nodes, {j.id: j for j in view.jobs.values() if not uses_gpus(j)}, view.capabilities
        )
        sized = self.replicas.decide(sub)
        resized = {d.job_id for d in sized}
        return [d for d in self.cpu.decide(sub) if d.job_id not in resized] + list(sized)

    def _gpu(self, view: ClusterView) -> list[Decision]:
        queued, _ = ready(view, view.queued)
        jobs = [j for j in view.jobs.values() if j.phase in (Phase.STARTING, Phase.RUNNING)] + queued
        jobs = [j for j in jobs if uses_gpus(j)]
        if not jobs:
            return []
        ledger = GpuLedger(view)
        free = sum(ledger.capacity.values())
        sp = Speedups(ledger.per_node, learn=self.learn_speedup, carry_noise=self.carry_noise)
        rem = {j.id: sp.remaining_ref_s(j) for j in jobs}
        busy = sum(held_gpus(j) for j in jobs) >= self.busy_fraction * free
        margin = self.change_margin if busy else 0.0

        def time_at(j: JobView, k: int) -> float:
            """Seconds to finish on k GPUs, counting the restart a change would cost."""
            t = rem[j.id] / sp(j, k)
            if k == held_gpus(j):
                return t
            return t * (1.0 + margin) + restart_s(j)

        def key(j: JobView) -> tuple[int, float, float, str]:
            urgent = 0
            if j.qoe_deadline is not None and view.now + time_at(j, max(1, held_gpus(j))) * self.deadline_slack > (
                j.qoe_deadline
            ):
                urgent = -1
            k = rem[j.id]
            if held_gpus(j):
                k /= self.preempt_ratio  # a running job keeps its GPU unless a much shorter one waits
            return (urgent, k, j.submitted_at, j.id)

        order = sorted(jobs, key=key)
        n: dict[str, int] = {}
        for j in order:
            n[j.id] = 1 if free >= 1 else 0
            free -= n[j.id]
        waiting = sum(1 for j in order if n[j.id] == 0)
        total = max(sum(ledger.capacity.values()), 1)
        price = self.queue_price * waiting / total

        def gain(j: JobView) -> float:
            """What the job's next GPU is worth: the best time saved per GPU, net of the price
            of the GPU-seconds it burns, over a step to one more GPU or to a larger count worth
            looking at (`lookahead`), weighted by 1/T^alpha."""
            k, most = n[j.id], sp.most(j)
            if k == 0 or k + 1 > most:
                return 0.0
            t0 = time_at(j, k)
            best = float("-inf")
            for m in self._steps(sp, j, k, most):
                tm = time_at(j, m)
                best = max(best, ((t0 - tm) - price * max(m * tm - k * t0, 0.0)) / (m - k))
            held = held_gpus(j)
            size = time_at(j, held) if self.weight_at_held and 0 < k < held else t0
            return best / size**self.alpha

        def fastest_up_to(j: JobView, top: int) -> int:
            times = {m: time_at(j, m) for m in range(1, top + 1)}
            return min(times, key=lambda m: (times[m], -m))

        hand_out(order, n, free, gain)
        if self.lookahead != "none":
            # A job handed GPUs towards a count past a dip, but not all the way, would land in
            # the dip: it keeps the fastest count up to what it was handed.
            for j in order:
                if n[j.id] > 1:
                    n[j.id] = fastest_up_to(j, n[j.id])

        def why(j: JobView, k: int) -> str:
            if k == 0:
                return f"{rem[j.id] / 3600:.2f} h of work left; shorter or urgent jobs hold every GPU"
            return f"finishes in ~{time_at(j, k) / 3600:.2f} h on {k} GPUs (speedup {sp(j, k):.2f}×)"

        return apply_targets(view, order, n, self.name, why, ledger)

    def _steps(self, sp: Speedups, j: JobView, k: int, most: int) -> list[int]:
        """The GPU counts above k that the job's next GPU is judged against."""
        if self.lookahead == "all" or (self.lookahead == "measured" and j.oracle is not None):
            return list(range(k + 1, most + 1))  # in an oracle study every count is known
        if self.lookahead == "measured":
            return [k + 1] + [g for g, _ in sp.curve(j).points if k + 1 < g <= most]
        return [k + 1]
