"""`tiresias`: discretised two-dimensional least-attained-service (Tiresias, NSDI'19).

Attained service is GPU-time (GPUs × seconds run). Two queues: a job starts in the high
queue and drops to the low one once it has received `threshold_gpu_h` GPU-hours (16, as in
the Pollux artifact's Tiresias). Within a queue, first come first served. Every round the
queues are walked high then low; a job runs if its requested GPUs still fit in the count of
GPUs left, otherwise it waits — and a running job that no longer makes the cut is preempted
(it resumes later from its checkpoint). Jobs are never resized.

Starvation guard: a low-queue job that has waited `starvation_factor` × its service time
since it last ran is promoted back to the high queue with its service count reset
(0 disables, which is what the published comparison used).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.model import ClusterView, Decision, JobView, Phase, Place, Preempt, Wait
from sluice.policy.parts.gpu import GpuLedger, describe, gpu_allocation, requested_gpus


@dataclass
class _State:
    queue: int
    seq: int
    service_offset: float = 0.0
    pending_s: float = 0.0
    last_seen: float = 0.0


class TiresiasPolicy:
    name = "tiresias"

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
        total = sum(n.gpus for n in view.nodes.values() if n.schedulable)
        left = total
        run: set[str] = set()
        for j in order:
            need = requested_gpus(j)
            if need <= left:
                run.add(j.id)
                left -= need
        out: list[Decision] = []
        for j in order:
            if j.phase != Phase.QUEUED and j.id not in run and not j.phase.terminal:
                out.append(Preempt(j.id, f"tiresias: {self._where(j)} — jobs ahead of it need its GPUs"))
        ledger = GpuLedger(view)
        starting = sorted(
            (j for j in order if j.phase == Phase.QUEUED and j.id in run), key=lambda j: -requested_gpus(j)
        )
        for j in starting:
            need = requested_gpus(j)
            pieces = ledger.take(need)
            if pieces is None:
                out.append(Wait(j.id, f"tiresias: {self._where(j)}, waiting for {need} GPUs to be freed"))
                continue
            out.append(
                Place(j.id, gpu_allocation(j, pieces), f"tiresias: {self._where(j)}; {need} GPUs on {describe(pieces)}")
            )
        for j in order:
            if j.phase == Phase.QUEUED and j.id not in run:
                out.append(Wait(j.id, f"tiresias: {self._where(j)}; {requested_gpus(j)} GPUs do not fit behind it"))
        return out

    def _where(self, j: JobView) -> str:
        st = self._state[j.id]
        served_h = (j.attained_service - st.service_offset) / 3600.0
        q = "high" if st.queue == 0 else "low"
        return f"{q} queue (position {st.seq}), {served_h:.1f} GPU-h attained"
