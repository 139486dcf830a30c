"""`pollux`, `optimus`, `tiresias` and `sluice` size CPU data-parallel jobs (`resources.replicas:
{min, max}`) each by its own rule, as they size GPU jobs, from what a real engine measures:
pollux by the generalised mean of speedups with a change discounted by its restart, optimus
by the fall in remaining time (restarts not counted), sluice by the soonest finish with the
resize cost and a margin; tiresias places and preempts fixed gangs by attained service and
says why it never resizes. Every decision carries its reason (what `sluice job why` prints)."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from sluice.model import (
    ClusterView,
    JobView,
    NodeHealth,
    NodeView,
    Phase,
    Place,
    Preempt,
    ProgressSignals,
    Resize,
    Wait,
)
from sluice.policy.registry import make_policy

from .test_learned_speedup import _cpu_job, _cpu_view, rep

SIZERS = ["pollux", "optimus", "sluice"]


def _resizes(policy: str, view: ClusterView) -> list[Resize]:
    return [d for d in make_policy(policy).decide(view) if isinstance(d, Resize) and d.job_id == "ddp"]


def _queued(jid: str, at: float, lo: int = 1, hi: int = 4, served: float = 0.0) -> JobView:
    return JobView(
        id=jid,
        tenant="t",
        name=jid,
        phase=Phase.QUEUED,
        submitted_at=at,
        cpu_min=1.0,
        replicas_min=lo,
        replicas_max=hi,
        attained_service=served,
        progress=ProgressSignals(total_steps=10_000),
    )


def _nodes(cores_each: float, count: int = 2) -> MappingProxyType[str, NodeView]:
    return MappingProxyType(
        {f"c{i}": NodeView(f"c{i}", cores_each, 0, health=NodeHealth.HEALTHY) for i in range(count)}
    )


@pytest.mark.parametrize("policy", SIZERS)
def test_a_measured_job_explores_one_step_beyond_what_was_measured(policy: str) -> None:
    ds = _resizes(policy, _cpu_view(_cpu_job(1, (rep(1, 10.0),))))
    assert len(ds) == 1 and ds[0].allocation.replicas == 2, ds  # 4 allowed, 2 × the most measured
    assert f"{policy}: 1 -> 2 replicas" in ds[0].reason and "measured by replicas 1: 10" in ds[0].reason


@pytest.mark.parametrize("policy", SIZERS)
def test_a_size_measured_slower_goes_back(policy: str) -> None:
    ds = _resizes(policy, _cpu_view(_cpu_job(2, (rep(1, 10.0), rep(2, 4.0)))))
    assert len(ds) == 1 and ds[0].allocation.replicas == 1, ds
    assert "2 -> 1 replicas" in ds[0].reason and "2: 4" in ds[0].reason


@pytest.mark.parametrize("policy", SIZERS)
def test_nothing_changes_before_the_size_held_is_measured(policy: str) -> None:
    assert _resizes(policy, _cpu_view(_cpu_job(1, (rep(1, 10.0, seconds=5.0),)))) == []
    # a size measured faster is kept; the scaling job is not shrunk back either
    assert _resizes(policy, _cpu_view(_cpu_job(2, (rep(1, 10.0), rep(2, 19.0))), cores=2.0)) == []


def test_pollux_counts_the_restart_where_optimus_does_not() -> None:
    nearly_done = _cpu_job(1, (rep(1, 10.0),), total=300)  # 20 s left: a 30 s restart cannot pay
    view = _cpu_view(nearly_done)
    assert _resizes("pollux", view) == [] and _resizes("sluice", view) == []
    ds = _resizes("optimus", view)
    assert len(ds) == 1 and "restarts not counted" in ds[0].reason


@pytest.mark.parametrize("policy", SIZERS)
def test_replicas_only_where_the_cores_are_free(policy: str) -> None:
    assert _resizes(policy, _cpu_view(_cpu_job(1, (rep(1, 10.0),)), cores=1.0)) == []


def test_pollux_gives_the_spare_replicas_to_the_job_that_scales() -> None:
    scales = replace(_cpu_job(2, (rep(1, 10.0), rep(2, 19.0))), id="scales", name="scales")
    flat = replace(_cpu_job(2, (rep(1, 10.0), rep(2, 6.0))), id="flat", name="flat", submitted_at=-1.0)
    view = ClusterView(100.0, _nodes(4.0), MappingProxyType({"scales": scales, "flat": flat}))
    ds = {d.job_id: d for d in make_policy("pollux").decide(view)}
    assert isinstance(ds["flat"], Resize) and ds["flat"].allocation.replicas == 1
    assert isinstance(ds["scales"], Resize) and ds["scales"].allocation.replicas == 4


@pytest.mark.parametrize("policy", ["pollux", "optimus", "tiresias"])
def test_a_queued_elastic_job_starts_at_its_min(policy: str) -> None:
    view = ClusterView(0.0, _nodes(2.0), MappingProxyType({"q": _queued("q", 0.0, lo=2)}))
    ds = make_policy(policy).decide(view)
    assert len(ds) == 1 and isinstance(ds[0], Place) and ds[0].allocation.replicas == 2, ds
    assert "2 replicas on c0:1+c1:1" in ds[0].reason
    # tiresias places it fixed; the controller says so, with tiresias' own why (test_controller_round)
    assert getattr(make_policy(policy), "resizes_replicas", False) == (policy != "tiresias")


def test_tiresias_never_resizes_a_measured_job() -> None:
    assert [d for d in make_policy("tiresias").decide(_cpu_view(_cpu_job(1, (rep(1, 10.0),))))] == []


def test_tiresias_preempts_a_cpu_gang_that_has_had_its_service_for_a_new_one() -> None:
    old = replace(_cpu_job(2, (rep(2, 10.0),), lo=2, hi=2), attained_service=600.0)
    new = _queued("new", 50.0, lo=2, hi=2)
    view = ClusterView(100.0, _nodes(1.0), MappingProxyType({old.id: old, "new": new}))
    pol = make_policy("tiresias", threshold_gpu_h=0.1)  # 360 core-seconds
    ds = {d.job_id: d for d in pol.decide(view)}
    assert (
        isinstance(ds["ddp"], Preempt) and "low queue" in ds["ddp"].reason and "need its replicas" in ds["ddp"].reason
    )
    assert isinstance(ds["new"], Wait) and "waiting for 2 replicas to be freed" in ds["new"].reason
    assert "CPU-h attained" in ds["new"].reason
