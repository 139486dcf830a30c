"""Guarantees are guarantees: no policy, FlowCon's included, ever sets a CPU limit below a
job's `cpu.min`. Random nodes, jobs (guarantees that fit, loss histories flat or learning,
QoE deadlines) and times, thrown at every registered policy over several rounds."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.model import Allocation, ClusterView, JobView, NodeView, Phase, Place, ProgressSignals, Resize
from sluice.policy import make_policy
from sluice.policy.registry import POLICIES


@st.composite
def clusters(draw: st.DrawFn) -> tuple[float, list[JobView]]:
    cores = draw(st.sampled_from([2.0, 4.0, 8.0, 16.0]))
    n = draw(st.integers(1, 6))
    left = cores
    jobs = []
    for i in range(n):
        cpu_min = draw(st.floats(0.05, max(0.05, left / 2))) if left > 0.1 else 0.05
        left -= cpu_min
        cpu_max = draw(st.one_of(st.none(), st.floats(cpu_min, cores)))
        start = draw(st.floats(0.3, 1.0))
        slope = draw(st.sampled_from([0.0, 0.001, 0.05, 0.5]))
        losses = tuple((t * 10.0, max(start - slope * t, 0.01)) for t in range(40))
        usage = draw(st.floats(0.01, cores))
        limit = draw(st.one_of(st.none(), st.floats(cpu_min, cores)))
        qoe = draw(st.one_of(st.none(), st.tuples(st.floats(0.01, 0.5), st.floats(50, 2000))))
        jobs.append(
            JobView(
                f"j{i}",
                "t",
                f"j{i}",
                Phase.RUNNING,
                0.0,
                cpu_min=cpu_min,
                cpu_max=cpu_max,
                allocation=Allocation.single("n0", cpu_min, limit),
                started_at=0.0,
                progress=ProgressSignals(
                    step=40,
                    loss_history=tuple((t, v / start) for t, v in losses),
                    usage_history=tuple((t, usage) for t, _ in losses),
                    total_steps=1000,
                ),
                qoe_loss=qoe[0] if qoe else None,
                qoe_deadline=qoe[1] if qoe else None,
            )
        )
    return cores, jobs


@settings(max_examples=60, deadline=None)
@given(clusters(), st.sampled_from(sorted(POLICIES)), st.floats(1.0, 60.0))
def test_no_policy_sets_a_cpu_limit_below_cpu_min(case: tuple[float, list[JobView]], name: str, step: float) -> None:
    cores, jobs = case
    policy = make_policy(name, interval_s=1.0)
    node = NodeView("n0", cores)
    by_id = {j.id: j for j in jobs}
    for k in range(6):
        now = 400.0 + k * step
        view = ClusterView(now, MappingProxyType({"n0": node}), MappingProxyType(dict(by_id)))
        for d in policy.decide(view):
            if not isinstance(d, Resize | Place):
                continue
            job = by_id[d.job_id]
            for a in d.allocation.assignments:
                assert a.cpu_limit is None or a.cpu_limit >= job.cpu_min - 1e-9, (name, d)
            if isinstance(d, Resize):  # the resize happened: the next round sees it
                by_id[d.job_id] = replace(job, allocation=d.allocation)
