"""kube and flowcon as pure functions of hand-built ClusterViews."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from sluice.model import Allocation, ClusterView, JobView, NodeHealth, NodeView, Phase, Place, Resize, Wait
from sluice.model.progress import ProgressSignals
from sluice.policy.flowcon import FlowConPolicy, growth_efficiency
from sluice.policy.kube import KubePolicy


def view(now: float, nodes: list[NodeView], jobs: list[JobView]) -> ClusterView:
    return ClusterView(now, MappingProxyType({n.name: n for n in nodes}), MappingProxyType({j.id: j for j in jobs}))


def queued(jid: str, cpu: float = 1.0, t: float = 0.0, prio: int = 0) -> JobView:
    return JobView(jid, "t", jid, Phase.QUEUED, t, priority=prio, cpu_min=cpu)


def running(
    jid: str,
    node: str,
    losses: list[tuple[float, float]],
    limit: float | None = None,
    usage: float = 1.0,
    cpu: float = 0.5,
) -> JobView:
    mx = max(v for _, v in losses) if losses else 1.0
    pr = ProgressSignals(
        step=len(losses),
        loss_history=tuple((t, v / mx) for t, v in losses),
        usage_history=tuple((t, usage) for t, _ in losses),
    )
    return JobView(
        jid, "t", jid, Phase.RUNNING, 0.0, cpu_min=cpu, allocation=Allocation.single(node, cpu, limit), progress=pr
    )


def test_kube_spreads_fifo_and_skips_what_does_not_fit() -> None:
    nodes = [NodeView("a", 2.0), NodeView("b", 2.0)]
    jobs = [queued("big", 4.0, t=0), queued("j1", 1.0, t=1), queued("j2", 1.0, t=2), queued("hi", 1.0, t=3, prio=5)]
    out = KubePolicy().decide(view(10, nodes, jobs))
    places = [d for d in out if isinstance(d, Place)]
    assert [p.job_id for p in places] == ["hi", "j1", "j2"]
    assert {p.allocation.primary_node for p in places[:2]} == {"a", "b"}  # spread
    assert all(p.allocation.assignments[0].cpu_limit is None for p in places)
    waits = {d.job_id: d.reason for d in out if isinstance(d, Wait)}
    assert (
        waits["big"].startswith("Unschedulable: one replica needs 4 CPU") and "largest node has 2 CPU" in waits["big"]
    )
    assert all(d.reason for d in out)


def test_kube_never_places_on_cordoned_node() -> None:
    nodes = [NodeView("a", 2.0, health=NodeHealth.CORDONED), NodeView("b", 1.0)]
    out = KubePolicy().decide(view(0, nodes, [queued("x"), queued("y", t=1)]))
    assert [d.allocation.primary_node for d in out if isinstance(d, Place)] == ["b"]
    assert isinstance(out[-1], Wait)


def test_growth_efficiency_follows_the_formula() -> None:
    # loss 1.0 over (0,30], 0.5 over (30,60] -> normalised means 1.0 and 0.5; P = 0.5 per 0.5 min = 1.0/min
    losses = [(10.0, 1.0), (20.0, 1.0), (40.0, 0.5), (50.0, 0.5)]
    job = running("a", "n", losses, usage=1.0)
    eff = growth_efficiency(job, now=60.0, delta_s=30.0, node_cpu=2.0, unit_s=60.0)
    assert eff is not None
    assert eff.p == pytest.approx(1.0) and eff.r == pytest.approx(0.5) and eff.g == pytest.approx(2.0)


def test_flowcon_moves_cpu_to_the_job_still_learning() -> None:
    pol = FlowConPolicy(interval_s=30.0)
    node = NodeView("n", 2.0)
    fast = [(t, 1.0 / (1 + t / 10)) for t in range(1, 120, 5)]
    flat = [(t, 0.3 + 0.0001 * ((t // 5) % 2)) for t in range(1, 120, 5)]
    jobs = [running("fast", "n", fast), running("flat", "n", flat)]
    pol.decide(view(0.0, [node], jobs))  # first call only starts the clock
    limits: dict[str, float] = {}
    for now in (60.0, 90.0, 120.0):
        for d in pol.decide(view(now, [node], jobs)):
            if isinstance(d, Resize):
                limits[d.job_id] = d.allocation.assignments[0].cpu_limit  # type: ignore[assignment]
                assert "flowcon" in d.reason
    assert limits["fast"] > limits["flat"]
    # flat is completing after two low intervals: keeps cores/(beta*n) = 2/(1.5*2)
    assert limits["flat"] == pytest.approx(2 / 3, rel=0.01)


def test_flowcon_lifts_limits_and_backs_off_when_all_complete() -> None:
    pol = FlowConPolicy(interval_s=30.0)
    node = NodeView("n", 2.0)
    flat = [(t, 0.3) for t in range(1, 200, 5)]
    jobs = [running("a", "n", flat, limit=1.0), running("b", "n", flat, limit=1.0)]
    pol.decide(view(0.0, [node], jobs))
    out: list = []
    for now in (30.0, 60.0, 90.0):  # no history yet, then watching, then completing
        out = pol.decide(view(now, [node], jobs))
    assert {d.job_id for d in out if isinstance(d, Resize)} == {"a", "b"}
    assert all(d.allocation.assignments[0].cpu_limit is None for d in out if isinstance(d, Resize))
    assert pol.interval_s == 60.0


def test_flowcon_judges_a_job_that_reports_less_often_than_delta() -> None:
    # one report every 20 s with Δ = 5 s: the windows widen to the reporting gap
    losses = [(t, 1.0 / (1 + t / 50)) for t in range(0, 200, 20)]
    job = running("slow", "n", losses, usage=0.5)
    eff = growth_efficiency(job, now=200.0, delta_s=5.0, node_cpu=2.0, unit_s=60.0)
    assert eff is not None and eff.p > 0


def test_a_gang_that_does_not_fit_says_what_is_free_before_it_not_after_its_own_replicas() -> None:
    # Seen live (helper queuewalk): 1 core free, a gang of 2 x 1 core waited saying
    # "0.00 CPU unrequested": the free cores counted after its first replica's trial.
    nodes = [NodeView("a", 2.0), NodeView("b", 2.0)]
    busy = [
        JobView(f"r{i}", "t", f"r{i}", Phase.RUNNING, 0.0, cpu_min=1.0, allocation=Allocation.single(n, 1.0, None))
        for i, n in enumerate(["a", "a", "b"])
    ]
    gang = JobView("gang", "t", "gang", Phase.QUEUED, 1.0, cpu_min=1.0, replicas_min=2)
    out = KubePolicy().decide(view(10, nodes, [*busy, gang]))
    (wait,) = [d for d in out if isinstance(d, Wait) and d.job_id == "gang"]
    assert "1.00 CPU unrequested" in wait.reason, wait.reason
    assert "2 replicas (room for 1; a gang starts all or none)" in wait.reason
    assert not [d for d in out if isinstance(d, Place)]
