"""`sluice bench fairness`'s own arithmetic: quotas from GPU-time shares, and the meter that
turns the book's records into satisfaction, Jain's index and guarantee violations. The
simulations themselves run through the production controller (tests/unit/test_sim_driver.py
and the benchmark)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sluice.bench.fairness import FairnessMeter, entitlements, queues_for
from sluice.control.simulate import SimConfig, WorkloadJob, run_simulation
from sluice.model import Allocation, JobRecord, Phase
from sluice.model.queue import Reclaim
from sluice.spec import JobSpec


def wj(user: str, gpus: int, hours: float, at: float = 0.0) -> WorkloadJob:
    return WorkloadJob(f"{user}-{gpus}-{hours}-{at}", at, "trace", gpus=gpus, duration_s=hours * 3600, user=user)


def test_quotas_follow_gpu_time_shares_sum_to_the_cluster_and_fit_each_tenants_biggest_job() -> None:
    jobs = [wj("a", 1, 60), wj("b", 1, 30), wj("c", 8, 1)]  # c: 8 of 98 GPU-hours, but one 8-GPU job
    q = entitlements(jobs, 64)
    assert sum(q.values()) == 64
    assert q["c"] == 8
    assert q["a"] == 37 and q["b"] == 19  # the other 56 by share (2:1), largest remainder


def test_setups_map_to_queue_settings() -> None:
    quota = {"a": 4, "b": 4}
    assert queues_for("no-quotas", quota) == ()
    strict = queues_for("strict", quota)
    assert all(q.cohort is None for q in strict)
    drf, pre = queues_for("borrow-drf", quota), queues_for("borrow-drf-preempt", quota)
    assert {q.reclaim_within_cohort for q in drf} == {Reclaim.NEVER}
    assert {q.reclaim_within_cohort for q in pre} == {Reclaim.ANY}
    assert {q.cohort for q in pre} == {"philly"}


def rec(job_id: str, tenant: str, gpus: int, phase: Phase, on: int | None = None) -> JobRecord:
    spec = JobSpec.model_validate(
        {"name": job_id, "command": ["x"], "resources": {"gpus": 1, "replicas": {"min": gpus, "max": gpus}}}
    )
    job = JobRecord(id=job_id, tenant=tenant, spec=spec, submitted_at=0.0, phase=phase)
    if on is not None:
        job = replace(job, allocation=Allocation.single("n0", gpus=on))
    return job


def test_a_job_waiting_within_its_tenants_unused_quota_past_grace_is_a_violation() -> None:
    m = FairnessMeter({"a": 8, "b": 8}, gpus=16, interval_s=60, grace_s=120, horizon_s=1e9)
    hog = rec("b1", "b", 12, Phase.RUNNING, on=12)  # b borrows 4 of a's GPUs
    waits = rec("a1", "a", 4, Phase.PENDING)  # fits a's unused quota (8 - 0)
    big = rec("a2", "a", 16, Phase.PENDING)  # never fits a's quota: not a violation
    for t in range(0, 301, 60):
        m.observe(float(t), [hog, waits, big])
    assert set(m.violated) == {"a1"} and m.violated["a1"] == pytest.approx(300 - 120)
    sat = m.satisfaction()
    assert sat["a"] == 0.0 and sat["b"] == 1.0  # b got min(12, 8) = its quota's worth
    assert m.jain() == pytest.approx(0.5)
    assert m.alloc_s == pytest.approx(12 * 60 * 6)


def test_no_quota_run_gives_the_big_tenant_everything_and_the_meter_sees_it() -> None:
    """End to end through the production controller: with no quotas, tenant a's early
    backlog takes the whole cluster and b's job waits within b's entitlement."""
    jobs = [wj("a", 8, 2.0, at=0.0) for _ in range(3)] + [wj("b", 8, 1.0, at=120.0)]
    quota = {"a": 8, "b": 8}
    meter = FairnessMeter(quota, gpus=16, interval_s=60, grace_s=60, horizon_s=4 * 3600)
    run_simulation(jobs, "binpack", SimConfig(nodes=2, gpus_per_node=8), observe=meter.observe)
    assert meter.violated and set(meter.violated_tenant.values()) == {"b"}
    # the same jobs with b's queue able to reclaim: b runs within a round or two, no violation
    cfg = SimConfig(nodes=2, gpus_per_node=8, queues=queues_for("borrow-drf-preempt", quota), preempt_min_runtime_s=0.0)
    fair = FairnessMeter(quota, gpus=16, interval_s=60, grace_s=60, horizon_s=4 * 3600)
    run_simulation([replace(j, queue=f"vc-{j.user}") for j in jobs], "binpack", cfg, observe=fair.observe)
    assert not fair.violated
