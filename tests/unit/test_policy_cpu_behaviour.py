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
    mid = cpu_job("mid", "n0", falling(600), left=600.0)
    far = cpu_job("far", "n0", falling(600), left=6000.0)
    jobs = [near, mid, far]
    d = {x.job_id: x for x in make_policy("sluice").decide(view(jobs, 600.0)) if isinstance(x, Resize)}
    assert set(d) == {"near", "mid"}  # "far" keeps its weight: an equal split of the node (makespan)
    req = {j.id: (d[j.id].allocation if j.id in d else j.allocation).assignments[0].cpu_request for j in jobs}
    assert req["near"] > req["far"] > req["mid"]
    assert all(x.allocation.assignments[0].cpu_limit is None for x in d.values())  # work-conserving: shares only
    assert abs(sum(req.values()) - 3.0) < 0.01  # the node's requests are conserved
    assert all(8.0 * r / sum(req.values()) >= 1.0 - 1e-9 for r in req.values())  # never below cpu.min


def _using(jid: str, node: str, cores: float, left: float, total: int = 1000) -> JobView:
    """A job that has used `cores` for the last minute and has `left` seconds of work at that pace."""
    steps = total - int(left)
    return JobView(
        id=jid,
        tenant="t",
        name=jid,
        phase=Phase.RUNNING,
        submitted_at=0.0,
        allocation=Allocation.single(node, 1.0),
        progress=ProgressSignals(
            step=steps,
            throughput=1.0,
            total_steps=total,
            predicted_remaining_s=left,
            usage_history=tuple((t, cores) for t in range(540, 601, 10)),
        ),
    )


def test_sluice_learns_what_a_job_can_use_and_gives_the_rest_to_the_others() -> None:
    # n0 is saturated: "small" used 1 core of the 2.67 it was offered (its demand is 1), the
    # two others used what they were offered. The shortest job is capped at its demand: the
    # cores it cannot use go to the next-shortest instead of being weighted to it.
    jobs = [_using("small", "n0", 1.0, 30.0), _using("mid", "n0", 3.5, 600.0), _using("far", "n0", 3.5, 900.0)]
    pol = make_policy("sluice")
    d = {x.job_id: x for x in pol.decide(view(jobs, 600.0)) if isinstance(x, Resize)}
    share = {j.id: (d[j.id].allocation if j.id in d else j.allocation).total_cpu_request for j in jobs}
    total = sum(share.values())
    assert 8.0 * share["small"] / total < 1.5  # ~its 1-core demand, not most of the node
    assert share["mid"] > share["far"] > share["small"]


def test_sluice_places_a_new_job_where_cores_are_unclaimed_not_least_requested() -> None:
    # n0 holds one job using 7 cores; n1 holds two jobs using 1 core each: n1 is more
    # requested (kube would pick n0) but has 6 unclaimed cores.
    busy = _using("busy", "n0", 7.0, 500.0)
    a, b = _using("a", "n1", 1.0, 500.0), _using("b", "n1", 1.0, 500.0)
    new = JobView(id="new", tenant="t", name="new", phase=Phase.QUEUED, submitted_at=1.0)
    pol = make_policy("sluice")
    pol.decide(view([busy, a, b], 590.0, n_nodes=2))  # learns the demands
    placed = [x for x in pol.decide(view([busy, a, b, new], 600.0, n_nodes=2)) if x.job_id == "new"]
    assert placed and placed[0].allocation is not None and placed[0].allocation.primary_node == "n1"
