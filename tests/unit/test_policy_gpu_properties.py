"""Properties every GPU policy must keep, on random hand-built views (hypothesis):
never more GPUs on a node than it has, nothing new on a cordoned or lost node, a reason on
every decision, at most one decision per job."""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.model import (
    Allocation,
    Assignment,
    ClusterView,
    Decision,
    JobView,
    Migrate,
    NodeHealth,
    NodeView,
    OracleInfo,
    Phase,
    Place,
    Preempt,
    ProgressSignals,
    Resize,
)
from sluice.policy.registry import make_policy

GPU_POLICIES = ["fifo", "binpack", "tiresias", "optimus", "pollux", "sluice"]


def _power(p: float) -> Callable[[Allocation], float]:
    return lambda a: float(a.total_gpus) ** p


@st.composite
def clusters(draw: st.DrawFn) -> ClusterView:
    n_nodes = draw(st.integers(1, 6))
    per = draw(st.sampled_from([2, 4, 8]))
    healths = draw(st.lists(st.sampled_from(list(NodeHealth)), min_size=n_nodes, max_size=n_nodes))
    nodes = {f"n{i}": NodeView(f"n{i}", cpu=4.0 * per, gpus=per, health=healths[i]) for i in range(n_nodes)}
    free = {f"n{i}": per for i in range(n_nodes) if healths[i] in (NodeHealth.HEALTHY, NodeHealth.SUSPECT)}
    jobs: dict[str, JobView] = {}
    for k in range(draw(st.integers(0, 12))):
        want = draw(st.integers(1, 2 * per))
        running = draw(st.booleans())
        alloc = None
        if running:
            pieces: dict[str, int] = {}
            need = want
            for node in list(free):
                take = min(free[node], need)
                if take:
                    pieces[node] = take
                    free[node] -= take
                    need -= take
                if need == 0:
                    break
            if need == 0:
                alloc = Allocation(tuple(Assignment(n, 1.0 * g, None, g) for n, g in pieces.items()))
            else:
                for node, g in pieces.items():
                    free[node] += g
        rem = draw(st.floats(60, 50_000))
        scale = draw(st.floats(0.3, 1.0))
        with_oracle = draw(st.booleans())  # half the jobs as in an oracle study, half as observed
        observed = draw(st.one_of(st.none(), st.floats(0, 50_000)))
        jobs[f"j{k}"] = JobView(
            id=f"j{k}",
            tenant="t",
            name=f"job{k}",
            phase=Phase.RUNNING if alloc is not None else Phase.QUEUED,
            submitted_at=float(k),
            gpus=1,
            replicas_min=want,
            replicas_max=2 * want,
            allocation=alloc,
            attained_service=draw(st.floats(0, 100_000)),
            progress=ProgressSignals(predicted_remaining_s=observed),
            oracle=OracleInfo(rem, 1, _power(scale)) if with_oracle else None,
        )
    return ClusterView(now=1000.0, nodes=MappingProxyType(nodes), jobs=MappingProxyType(jobs))


def _check(view: ClusterView, decisions: list[Decision]) -> None:
    used = {n: 0 for n in view.nodes}
    for j in view.jobs.values():
        if j.allocation is not None:
            for a in j.allocation.assignments:
                used[a.node] += a.gpus
    seen: set[str] = set()
    # Execute in order, as the controller does: stops free GPUs at once in the simulator.
    for d in decisions:
        assert d.reason.strip(), f"{type(d).__name__} for {d.job_id} has no reason"
        assert d.job_id not in seen, f"two decisions for {d.job_id}"
        seen.add(d.job_id)
        job = view.jobs[d.job_id]
        if isinstance(d, Preempt) and job.allocation is not None:
            for a in job.allocation.assignments:
                used[a.node] -= a.gpus
        if isinstance(d, Place | Resize | Migrate):
            if isinstance(d, Resize) and job.allocation is not None:
                for a in job.allocation.assignments:
                    used[a.node] -= a.gpus
            for a in d.allocation.assignments:
                node = view.nodes[a.node]
                if isinstance(d, Place):
                    assert node.schedulable, f"placed {d.job_id} on {node.health} node {a.node}"
                used[a.node] += a.gpus
                assert used[a.node] <= node.gpus, f"{a.node} over-allocated by {d}"


@pytest.mark.parametrize("name", GPU_POLICIES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(view=clusters())
def test_gpu_policy_properties(name: str, view: ClusterView) -> None:
    policy = make_policy(name)
    _check(view, policy.decide(view))
