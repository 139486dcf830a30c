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


def test_the_profile_replays_the_steady_rate_not_the_warm_up() -> None:
    """A 600-step measuring run whose first 100 steps crawl (warm-up) and the rest go at 500
    steps/s, as rank 0's stats file holds it: the whole-run rate is far lower, and the
    simulator must get 500 — a long job spends almost all its time past the warm-up."""
    from sluice.bench.elastic import Overheads, measured_profile, steady_steps_s, throughput

    marks: list[tuple[int, float]] = [(s, 100.0 + s * 0.01) for s in range(0, 100, 10)]  # 100 steps/s
    marks += [(s, 101.0 + (s - 100) / 500.0) for s in range(100, 600, 10)]
    marks.append((599, 101.0 + 499 / 500.0))
    stats = {"start": 0, "last": 599, "t_first": 100.0 - 0.01, "t_end": marks[-1][1], "marks": marks}
    rate = throughput(1, stats, 128)
    assert rate.steps_s < 0.8 * 500.0  # what the table's whole-run column shows
    assert rate.steady_steps_s == pytest.approx(500.0)
    profile = measured_profile([rate], [], [Overheads(1, 3.0, 0.5)])
    assert profile.steps_per_s == (pytest.approx(500.0),)
    assert steady_steps_s(marks[:3]) == 0.0  # too few marks to tell
    few = throughput(1, {**stats, "marks": marks[:3]}, 128)
    assert few.steady_steps_s == few.steps_s  # then the whole run's rate stands in


def test_the_policy_table_sets_sim_over_real_beside_each_job_and_their_mean() -> None:
    """sim/real per contender and the mean, and the profile's rate against the rate the job's
    last attempt actually ran at (what a gap in JCT comes from)."""
    from rich.console import Console

    from sluice.bench.elastic import PolicyRun, print_policies

    runs = [
        PolicyRun("fixed 1", 100.0, 1, (), 90.0, 1, world=1, span_steps_s=450.0),
        PolicyRun("sluice", 80.0, 1, (), 88.0, 1, world=1, span_steps_s=500.0),
    ]
    console = Console(width=250, record=True)
    print_policies(runs, 40_000, console, PROFILE)
    text = console.export_text()
    assert "sim/real" in text and "0.90" in text and "1.10" in text
    assert "sim/real JCT: mean 1.00, range 0.90–1.10" in text
    assert "1.50" in text and "1.67" in text  # each job's 450 and 500 steps/s over the profile's 300
