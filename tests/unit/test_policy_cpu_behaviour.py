"""DQoES, SpeCon and sluice on CPU container jobs, with hand-built progress histories."""

from __future__ import annotations

from types import MappingProxyType

from sluice.model import (
    Allocation,
    ClusterView,
    JobView,
    Migrate,
    NodeView,
    Phase,
    ProgressSignals,
    Resize,
)
from sluice.policy.registry import make_policy


def signals(losses: list[tuple[float, float]], cores: float = 4.0, left: float | None = None) -> ProgressSignals:
    mx = max(v for _, v in losses)
    return ProgressSignals(
        step=len(losses),
        loss=losses[-1][1],
        best_loss=min(v for _, v in losses),
        max_loss=mx,
        throughput=1.0,
        predicted_remaining_s=left,
        loss_history=tuple((t, v / mx) for t, v in losses),
        usage_history=tuple((t, cores) for t, _ in losses),
    )


def cpu_job(
    jid: str,
    node: str,
    losses: list[tuple[float, float]],
    *,
    qoe: float | None = None,
    deadline: float | None = None,
    left: float | None = None,
) -> JobView:
    return JobView(
        id=jid,
        tenant="t",
        name=jid,
        phase=Phase.RUNNING,
        submitted_at=0.0,
        allocation=Allocation.single(node, 1.0),
        progress=signals(losses, left=left),
        qoe_loss=qoe,
        qoe_deadline=deadline,
    )


def falling(t_end: float, t0: float = 0.0, start: float = 2.0, rate: float = 0.002) -> list[tuple[float, float]]:
    return [(t, start / (1 + rate * (t - t0))) for t in range(int(t0), int(t_end) + 1, 10)]


def flat(t_end: float) -> list[tuple[float, float]]:
    return [(t, 0.5) for t in range(0, int(t_end) + 1, 10)]


def view(jobs: list[JobView], now: float, n_nodes: int = 1) -> ClusterView:
    ns = {f"n{i}": NodeView(f"n{i}", 8.0) for i in range(n_nodes)}
    return ClusterView(now, MappingProxyType(ns), MappingProxyType({j.id: j for j in jobs}))


def test_dqoes_gives_a_job_behind_its_target_more_cores_than_one_without() -> None:
    behind = cpu_job("behind", "n0", falling(600), qoe=0.5, deadline=900.0)  # needs ~900 s more, has 300
    other = cpu_job("other", "n0", falling(600))
    d = {x.job_id: x for x in make_policy("dqoes").decide(view([behind, other], 600.0)) if isinstance(x, Resize)}
    assert "behind" in d
    lim_b = d["behind"].allocation.assignments[0].cpu_limit
    lim_o = d["other"].allocation.assignments[0].cpu_limit
    assert lim_b is not None and lim_o is not None and lim_b > lim_o
    assert "QoE" in d["behind"].reason


def test_specon_migrates_a_converged_job_off_a_crowded_node() -> None:
    young = falling(1030, t0=800.0)
    jobs = [cpu_job("done", "n0", flat(1030)), cpu_job("a", "n0", young), cpu_job("b", "n0", young)]
    pol = make_policy("specon")
    first = pol.decide(view(jobs, 1000.0, n_nodes=2))
    assert not any(isinstance(d, Migrate) for d in first)  # slow once: only watching
    second = pol.decide(view(jobs, 1030.0, n_nodes=2))
    moves = [d for d in second if isinstance(d, Migrate)]
    assert [m.job_id for m in moves] == ["done"]
    assert moves[0].allocation.primary_node == "n1" and "G=" in moves[0].reason


def test_sluice_weights_cpu_towards_the_job_closest_to_done_without_limits() -> None:
    near = cpu_job("near", "n0", falling(600), left=60.0)
    far = cpu_job("far", "n0", falling(600), left=6000.0)
    d = {x.job_id: x for x in make_policy("sluice").decide(view([near, far], 600.0)) if isinstance(x, Resize)}
    a_near, a_far = d["near"].allocation.assignments[0], d["far"].allocation.assignments[0]
    assert a_near.cpu_request > a_far.cpu_request
    assert a_near.cpu_limit is None and a_far.cpu_limit is None  # work-conserving: shares only
    assert abs(a_near.cpu_request + a_far.cpu_request - 2.0) < 0.01  # the node's requests are conserved
