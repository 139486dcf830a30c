"""`optimus`: remaining-time greedy allocation (Optimus, EuroSys'18, as in the Pollux artifact's
"Optimus+Oracle").

Every job that can gets one GPU (oldest first); then each spare GPU goes to the job whose
predicted remaining time falls the most with one more GPU. The batch size stays the user's
(no statistical-efficiency adaptation); jobs are re-sized whenever their share changes,
paying the restart each time — which is what the published comparison measured.
"""

from __future__ import annotations

from sluice.model import ClusterView, Decision, JobView
from sluice.policy.parts.replicas import ReplicaCurves
from sluice.policy.parts.sizing import Curves, gpu_then_cpu, size_by_gain
from sluice.policy.parts.units import Units


class OptimusPolicy:
    name = "optimus"
    resizes_replicas = True
    """Sizes a job within its `resources.replicas` range (the controller says so of a policy
    that does not)."""

    def __init__(self, learn_speedup: bool = True) -> None:
        self.learn_speedup = learn_speedup
        """Learn each job's speed-up curve from its measured rates (else the n^0.8 prior)."""

    def decide(self, view: ClusterView) -> list[Decision]:
        return gpu_then_cpu(view, self.learn_speedup, self._size)

    def _size(self, view: ClusterView, jobs: list[JobView], units: Units, sp: Curves) -> list[Decision]:
        """One rule for GPU jobs (in GPUs) and CPU data-parallel jobs (in replicas)."""
        rem = {j.id: sp.remaining_ref_s(j) for j in jobs}

        def gain(j: JobView, k: int) -> float:
            return rem[j.id] / sp(j, k) - rem[j.id] / sp(j, k + 1)

        def why(j: JobView, k: int) -> str:
            if k == 0:
                return (
                    f"no {units.unit[:-1]} left after "
                    + ("one each" if units.unit == "GPUs" else "each one's min")
                    + " for older jobs"
                )
            text = f"predicted remaining {rem[j.id] / sp(j, k) / 3600:.2f} h on {k} {units.unit}"
            if isinstance(sp, ReplicaCurves):
                text += f" ({sp.measured(j)}; restarts not counted, as in Optimus)"
            return text

        return size_by_gain(view, jobs, units, sp, gain, self.name, why)
