"""`tiresias`: discretised two-dimensional least-attained-service (Tiresias, NSDI'19).

Attained service is GPU-time (GPUs × seconds run). Two queues: a job starts in the high
queue and drops to the low one once it has received `threshold_gpu_h` GPU-hours (16, as in
the Pollux artifact's Tiresias). Within a queue, first come first served. Every round the
queues are walked high then low; a job runs if its requested GPUs still fit in the count of
GPUs left, otherwise it waits — and a running job that no longer makes the cut is preempted
(it resumes later from its checkpoint). Jobs are never resized.

CPU jobs (data-parallel or not) are walked the same way in a second pass, against the cores
of the schedulable nodes: a job's gang is its `replicas_min` replicas of `cpu_min` cores,
its service is CPU-seconds and the threshold counts core-hours. An elastic CPU job is
placed at its min and never resized — Tiresias has no model of what another size is worth,
only of how much service a job has had — and its placement reason says so.

Starvation guard: a low-queue job that has waited `starvation_factor` × its service time
since it last ran is promoted back to the high queue with its service count reset
(0 disables, which is what the published comparison used).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.model import ClusterView, Decision, JobView, Phase, Place, Preempt, Wait
from sluice.policy.parts.gpu import requested_gpus, uses_gpus
from sluice.policy.parts.units import GpuUnits, ReplicaUnits, Units


@dataclass
class _State:
    queue: int
    seq: int
    service_offset: float = 0.0
    pending_s: float = 0.0
    last_seen: float = 0.0


class TiresiasPolicy:
    name = "tiresias"
    fixed_replicas_why = "never resizes: it knows only attained service, not what another size would be worth"

    def __init__(self, threshold_gpu_h: float = 16.0, starvation_factor: float = 0.0) -> None:
        self.threshold_s = threshold_gpu_h * 3600.0
        self.starvation_factor = starvation_factor
        self._state: dict[str, _State] = {}
        self._seq = 0

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def decide(self, view: ClusterView) -> list[Decision]:
        now = view.now
        jobs = [j for j in view.jobs.values() if j.phase in (Phase.QUEUED, Phase.STARTING, Phase.RUNNING)]
        self._state = {k: v for k, v in self._state.items() if k in view.jobs}
        for j in sorted(jobs, key=lambda j: (j.submitted_at, j.id)):
            st = self._state.get(j.id)
            if st is None:
                st = self._state[j.id] = _State(0, self._next(), last_seen=now)
            served = j.attained_service - st.service_offset
            if j.phase == Phase.QUEUED:
                st.pending_s += now - st.last_seen
                if (
                    self.starvation_factor > 0
                    and st.queue == 1
                    and served > 0
                    and st.pending_s >= self.starvation_factor * served / max(requested_gpus(j), 1)
                ):
                    st.queue, st.seq, st.service_offset, st.pending_s = 0, self._next(), j.attained_service, 0.0
            else:
                st.pending_s = 0.0
                if st.queue == 0 and served >= self.threshold_s:
                    st.queue, st.seq = 1, self._next()
            st.last_seen = now
        order = sorted(jobs, key=lambda j: (self._state[j.id].queue, self._state[j.id].seq))
        gpu = [j for j in order if uses_gpus(j)]
        cpu = [j for j in order if not uses_gpus(j)]
        out = self._walk(gpu, GpuUnits(view))
        if cpu:
            out += self._walk(cpu, ReplicaUnits(view))
        return out

    def _walk(self, order: list[JobView], units: Units) -> list[Decision]:
        """Queues high then low: a job runs if its gang (the GPUs, or the replicas' cores, it
        asked for) still fits in what is left, else it waits or is preempted."""
        u = units.unit
        left = units.total()
        run: set[str] = set()
        for j in order:
            need = units.need(j, units.asked(j))
            if need <= left + 1e-9:
                run.add(j.id)
                left -= need
        out: list[Decision] = []
        for j in order:
            if j.phase != Phase.QUEUED and j.id not in run and not j.phase.terminal:
                out.append(Preempt(j.id, f"tiresias: {self._where(j)} — jobs ahead of it need its {u}"))
        starting = sorted(
            (j for j in order if j.phase == Phase.QUEUED and j.id in run), key=lambda j: -units.need(j, units.asked(j))
        )
        for j in starting:
            n = units.asked(j)
            alloc = units.take(j, n)
            if alloc is None:
                out.append(Wait(j.id, f"tiresias: {self._where(j)}, waiting for {n} {u} to be freed"))
                continue
            out.append(Place(j.id, alloc, f"tiresias: {self._where(j)}; {n} {u} on {units.where(alloc)}"))
        for j in order:
            if j.phase == Phase.QUEUED and j.id not in run:
                out.append(Wait(j.id, f"tiresias: {self._where(j)}; {units.asked(j)} {u} do not fit behind it"))
        return out

    def _where(self, j: JobView) -> str:
        st = self._state[j.id]
        served_h = (j.attained_service - st.service_offset) / 3600.0
        q = "high" if st.queue == 0 else "low"
        what = "GPU-h" if uses_gpus(j) else "CPU-h"
        return f"{q} queue (position {st.seq}), {served_h:.1f} {what} attained"
