"""`pollux`: goodput-driven elastic allocation in the spirit of Pollux (OSDI'21).

Jobs adapt their batch size to their GPUs (the driver runs them AdaptDL-style, hence
`adaptive_batch`), so a GPU is worth what it adds to a job's *goodput* — throughput times
statistical efficiency — as `elastic.Speedups` estimates it (the true curve only in an
oracle study). Pollux maximises a generalised mean of the jobs' speedups with p = -1, i.e.
minimises Σ 1/speedup: that first gives every job one GPU (oldest first), then hands each
spare GPU to the job whose 1/speedup falls most.
A change of allocation costs the job its restart, so a running job's speedup under any other
allocation is discounted by the restart time against its remaining time.

Pollux searches allocations with a genetic algorithm over exact placements; this greedy
over consolidated GPU counts is the simplification (documented in docs/policies.md).
"""

from __future__ import annotations

from sluice.model import ClusterView, Decision, JobView
from sluice.policy.parts.elastic import restart_s
from sluice.policy.parts.gpu import held_gpus
from sluice.policy.parts.replicas import ReplicaCurves, held_replicas
from sluice.policy.parts.sizing import Curves, gpu_then_cpu, size_by_gain
from sluice.policy.parts.units import Units


class PolluxPolicy:
    name = "pollux"
    resizes_replicas = True
    """Sizes a job within its `resources.replicas` range (the controller says so of a policy
    that does not)."""
    adaptive_batch = True

    def __init__(self, p: float = -1.0, learn_speedup: bool = True) -> None:
        if p >= 0:
            raise ValueError(f"p must be negative (a fairness-leaning mean), got {p}")
        self.p = p
        self.learn_speedup = learn_speedup
        """Learn each job's goodput curve from its measured rates (else the n^0.8 prior)."""

    def decide(self, view: ClusterView) -> list[Decision]:
        return gpu_then_cpu(view, self.learn_speedup, self._size)

    def _size(self, view: ClusterView, jobs: list[JobView], units: Units, sp: Curves) -> list[Decision]:
        """One rule for GPU jobs (in GPUs) and CPU data-parallel jobs (in replicas)."""
        rem = {j.id: sp.remaining_ref_s(j) for j in jobs}
        held = held_gpus if units.unit == "GPUs" else held_replicas

        def eff(j: JobView, k: int) -> float:
            """Speedup at k units, counting the restart a change would cost."""
            s = sp(j, k)
            if k == 0 or k == held(j):
                return s
            r = rem[j.id]
            return r / (r / s + restart_s(j))

        def gain(j: JobView, k: int) -> float:
            return eff(j, k) ** self.p - eff(j, k + 1) ** self.p

        def why(j: JobView, k: int) -> str:
            if k == 0:
                return f"every {units.unit[:-1]} already serves an older job"
            text = f"speedup {sp(j, k):.2f}× on {k} {units.unit}"
            if isinstance(sp, ReplicaCurves):
                text += f"; {sp.measured(j)}; a change discounted by a {restart_s(j):.0f}s restart"
            return text

        return size_by_gain(view, jobs, units, sp, gain, self.name, why)
