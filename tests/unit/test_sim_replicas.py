"""The simulator's CPU data-parallel jobs replay a measured profile (steps/s per replica
count, start-up, resize cost, end), and the policies size them there by the same decisions
they make on a real engine: what `sluice bench elastic` sets beside its real runs."""

from __future__ import annotations

import pytest

from sluice.control.simulate import ReplicaProfile, SimConfig, WorkloadJob, run_simulation

PROFILE = ReplicaProfile((1, 2, 4), (300.0, 100.0, 60.0), (4.0, 6.0, 9.0), 5.0, 0.5)
CFG = SimConfig(nodes=2, gpus_per_node=0, cpus_per_node=1.0, interval_s=1.0)


def _job(steps: int) -> WorkloadJob:
    return WorkloadJob("ddp", 0.0, "replicas", cpu_steps=steps, cpus=0.5, replicas_max=2, replica_profile=PROFILE)


def test_the_profile_interpolates_between_measured_counts_and_rejects_nonsense() -> None:
    assert PROFILE.rate(2) == 100.0 and PROFILE.rate(8) == 60.0
    assert 60.0 < PROFILE.rate(3) < 100.0
    assert PROFILE.start_at(3) == 6.0
    with pytest.raises(ValueError):
        ReplicaProfile((2, 1), (1.0, 1.0), (0.0, 0.0), 1.0)


def test_a_job_left_at_its_size_takes_start_plus_work_plus_end() -> None:
    r = run_simulation([_job(30_000)], "tiresias", CFG).jobs[0]
    assert r.jct_s == pytest.approx(4.0 + 30_000 / 300.0 + 0.5, abs=1e-6)
    assert r.restarts == 0


@pytest.mark.parametrize("policy", ["sluice", "pollux", "optimus"])
def test_a_long_job_explores_two_replicas_pays_the_resize_twice_and_comes_back(policy: str) -> None:
    r = run_simulation([_job(60_000)], policy, CFG).jobs[0]
    assert r.restarts == 2  # 1 -> 2 (measured slower) -> 1
    alone = 4.0 + 60_000 / 300.0 + 0.5
    assert alone + 2 * 5.0 < r.jct_s < alone + 60.0, r.jct_s
