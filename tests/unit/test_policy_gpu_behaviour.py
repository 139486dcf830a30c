"""What each GPU policy is for, on small hand-built views."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from sluice.model import (
    Allocation,
    Assignment,
    ClusterView,
    Decision,
    JobView,
    NodeHealth,
    NodeView,
    OracleInfo,
    Phase,
    Place,
    Preempt,
    ProgressSignals,
    Wait,
)
from sluice.policy.parts.elastic import (
    DEFAULT_REMAINING_S,
    DEFAULT_RESTART_S,
    SCALING_EXPONENT,
    Speedups,
    remaining_ref_s,
    restart_s,
)
from sluice.policy.registry import make_policy


def nodes(n: int, gpus: int = 4, cordoned: tuple[int, ...] = ()) -> dict[str, NodeView]:
    return {
        f"n{i}": NodeView(f"n{i}", 16.0, gpus, health=NodeHealth.CORDONED if i in cordoned else NodeHealth.HEALTHY)
        for i in range(n)
    }


def job(
    jid: str,
    want: int,
    t: float,
    *,
    on: dict[str, int] | None = None,
    service: float = 0.0,
    rem: float = 3600.0,
    speedup: Callable[[Allocation], float] | None = None,
    deadline: float | None = None,
) -> JobView:
    alloc = Allocation(tuple(Assignment(n, float(g), None, g) for n, g in on.items())) if on else None
    return JobView(
        id=jid,
        tenant="t",
        name=jid,
        phase=Phase.RUNNING if alloc else Phase.QUEUED,
        submitted_at=t,
        gpus=1,
        replicas_min=want,
        replicas_max=max(want, 8),
        allocation=alloc,
        attained_service=service,
        qoe_deadline=deadline,
        oracle=OracleInfo(rem, 1, speedup),
    )


def view(ns: dict[str, NodeView], *jobs: JobView, now: float = 100.0) -> ClusterView:
    return ClusterView(now, MappingProxyType(ns), MappingProxyType({j.id: j for j in jobs}))


def by_job(decisions: list[Decision]) -> dict[str, Any]:
    return {d.job_id: d for d in decisions}


def test_fifo_blocks_behind_the_head_but_binpack_backfills() -> None:
    v = view(nodes(1), job("big", 4, 1.0, on=None), job("run", 2, 0.0, on={"n0": 2}), job("small", 1, 2.0))
    fifo = by_job(make_policy("fifo").decide(v))
    assert isinstance(fifo["big"], Wait) and isinstance(fifo["small"], Wait)
    assert "behind" in fifo["small"].reason
    bp = by_job(make_policy("binpack").decide(v))
    assert isinstance(bp["big"], Wait) and isinstance(bp["small"], Place)


def test_binpack_consolidates_a_job_on_one_node() -> None:
    v = view(nodes(3), job("a", 2, 0.0, on={"n1": 2}), job("b", 2, 1.0))
    d = by_job(make_policy("binpack").decide(v))["b"]
    assert isinstance(d, Place) and d.allocation.gpus_per_node() == {"n1": 2}


def test_tiresias_demotes_after_16_gpu_hours_and_preempts_for_a_new_job() -> None:
    old = job("old", 4, 0.0, on={"n0": 4}, service=16 * 3600.0 + 1)
    new = job("new", 4, 50.0)
    d = by_job(make_policy("tiresias").decide(view(nodes(1), old, new)))
    assert isinstance(d["old"], Preempt) and "low queue" in d["old"].reason
    assert isinstance(d["new"], Wait)  # placed once the preempted job has left
    young = job("old", 4, 0.0, on={"n0": 4}, service=3600.0)
    d2 = by_job(make_policy("tiresias").decide(view(nodes(1), young, new)))
    assert "old" not in d2 and isinstance(d2["new"], Wait)


def test_tiresias_never_uses_cordoned_nodes() -> None:
    v = view(nodes(2, cordoned=(0,)), job("a", 4, 0.0), job("b", 4, 1.0))
    d = by_job(make_policy("tiresias").decide(v))
    assert isinstance(d["a"], Place) and d["a"].allocation.nodes == ("n1",)
    assert isinstance(d["b"], Wait)


def _linear(a: Allocation) -> float:
    return float(a.total_gpus)


def _flat(a: Allocation) -> float:
    return min(float(a.total_gpus), 1.0) + 0.01 * a.total_gpus


def test_optimus_gives_spare_gpus_to_the_job_that_scales() -> None:
    v = view(nodes(2), job("scales", 1, 0.0, speedup=_linear), job("flat", 1, 1.0, speedup=_flat))
    d = by_job(make_policy("optimus").decide(v))
    assert d["scales"].allocation.total_gpus > d["flat"].allocation.total_gpus
    assert d["flat"].allocation.total_gpus >= 1


def test_sluice_serves_the_shortest_job_first() -> None:
    v = view(nodes(1, gpus=1), job("long", 1, 0.0, rem=36_000.0), job("short", 1, 1.0, rem=600.0))
    d = by_job(make_policy("sluice").decide(v))
    assert isinstance(d["short"], Place) and isinstance(d["long"], Wait)


def test_sluice_keeps_a_running_job_unless_a_much_shorter_one_waits() -> None:
    running = job("run", 1, 0.0, on={"n0": 1}, rem=1000.0)
    slightly = job("q", 1, 1.0, rem=800.0)
    assert "run" not in by_job(make_policy("sluice").decide(view(nodes(1, gpus=1), running, slightly)))
    much = job("q", 1, 1.0, rem=100.0)
    d = by_job(make_policy("sluice").decide(view(nodes(1, gpus=1), running, much)))
    assert isinstance(d["run"], Preempt)


def test_sluice_puts_a_job_whose_deadline_is_at_risk_first() -> None:
    urgent = job("urgent", 1, 1.0, rem=20_000.0, deadline=5_000.0)
    short = job("short", 1, 0.0, rem=600.0)
    d = by_job(make_policy("sluice").decide(view(nodes(1, gpus=1), urgent, short)))
    assert isinstance(d["urgent"], Place) and isinstance(d["short"], Wait)


def test_pollux_gives_every_job_a_gpu_before_growing_one() -> None:
    v = view(nodes(1, gpus=2), job("a", 1, 0.0, speedup=_linear), job("b", 1, 1.0, speedup=_linear))
    d = by_job(make_policy("pollux").decide(v))
    assert d["a"].allocation.total_gpus == 1 and d["b"].allocation.total_gpus == 1


def observed(jid: str, t: float, *, on: dict[str, int] | None = None, predicted: float | None = None) -> JobView:
    """A job as a real engine shows it: no oracle, only what it reported."""
    base = job(jid, 1, t, on=on)
    progress = ProgressSignals(step=10, total_steps=1000, throughput=1.0, predicted_remaining_s=predicted)
    return replace(base, oracle=None, progress=progress if predicted is not None else ProgressSignals())


def test_sluice_without_an_oracle_orders_by_the_remaining_time_jobs_report() -> None:
    running = observed("run", 0.0, on={"n0": 1}, predicted=5_000.0)
    unknown = observed("q", 1.0)  # never ran: no estimate, assumed DEFAULT_REMAINING_S
    assert "run" not in by_job(make_policy("sluice").decide(view(nodes(1, gpus=1), running, unknown)))
    reported_short = observed("q", 1.0, predicted=100.0)  # ran before and reported it is nearly done
    d = by_job(make_policy("sluice").decide(view(nodes(1, gpus=1), running, reported_short)))
    assert isinstance(d["run"], Preempt)


def test_without_an_oracle_speedup_is_the_default_sublinear_model() -> None:
    j = observed("a", 0.0)
    sp = Speedups(per_node=4)
    assert sp(j, 1) == pytest.approx(1.0) and sp(j, 4) == pytest.approx(4**SCALING_EXPONENT)
    assert restart_s(j) == DEFAULT_RESTART_S and remaining_ref_s(j) == DEFAULT_REMAINING_S


def test_sluice_can_weigh_a_running_job_at_the_gpus_it_holds() -> None:
    """`weight_at_held`: a running job's GPUs below what it holds are weighed by its time at
    what it holds, not at the smaller count judged, so a long job is not taken down to one GPU
    just because it would look even longer there (docs/policies.md)."""

    def concave(a: Allocation) -> float:
        return float(a.total_gpus) ** 0.7

    long = job("long", 4, 0.0, on={"n0": 4}, rem=4 * 3600.0, speedup=concave)
    short = job("short", 4, 50.0, on={"n1": 4}, rem=1800.0, speedup=concave)
    new = job("new", 4, 90.0, rem=1800.0, speedup=concave)

    def gpus_left(**options: Any) -> int:
        d = by_job(make_policy("sluice", **options).decide(view(nodes(3), long, short, new)))
        return d["long"].allocation.total_gpus if "long" in d else 4

    assert gpus_left(weight_at_held=False) == 1  # at 1 GPU it looks 2.6x longer, so it gave up 3
    assert gpus_left() == gpus_left(weight_at_held=True) == 2  # the default since 2026-11-26
