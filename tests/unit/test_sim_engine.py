"""The sim engine: virtual time, exact completions, restarts, stops, node loss, CPU sharing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.model import (
    Allocation,
    Assignment,
    JobExited,
    JobProgress,
    JobStarted,
    JobUsage,
    LaunchRequest,
    NodeInfo,
    NodeLost,
    NodeUp,
)
from sluice.sim.cpu_profiles import family_curve
from sluice.sim.engine import CapacityError, SimEngine, water_fill
from sluice.sim.failures import FailurePlan
from sluice.sim.jobs import CpuJob, TraceJob
from sluice.spec import JobSpec


def gpus(**per_node: int) -> Allocation:
    return Allocation(tuple(Assignment(n, 1.0, None, g) for n, g in per_node.items()))


def req(job_id: str, alloc: Allocation, attempt: int = 1) -> LaunchRequest:
    return LaunchRequest(job_id, attempt, "t", JobSpec(command=["x"]), alloc, "/ckpt")


def engine(n: int = 2, g: int = 4, failures: FailurePlan | None = None) -> SimEngine:
    return SimEngine([NodeInfo(f"n{i}", 16.0, g) for i in range(n)], failures)


def test_a_trace_job_finishes_at_its_exact_virtual_time() -> None:
    e = engine()
    e.add_job("a", TraceJob(1000.0, 2))
    e.launch(req("a", gpus(n0=2)))
    assert isinstance(e.poll()[0], JobStarted)
    e.advance(600.0)
    ev = e.poll()
    assert any(isinstance(x, JobProgress) and x.step == 600 for x in ev)
    e.advance(1200.0)
    ev = e.poll()
    exits = [x for x in ev if isinstance(x, JobExited)]
    assert len(exits) == 1 and exits[0].exit_code == 0 and exits[0].time == pytest.approx(1000.0)
    assert e.completed_at["a"] == pytest.approx(1000.0)
    assert e.alive() == {}


def test_resizing_costs_a_restart_and_changes_speed() -> None:
    e = engine()
    e.add_job("a", TraceJob(1000.0, 2))
    e.launch(req("a", gpus(n0=2)))
    e.advance(100.0)
    e.resize("a", 1, gpus(n0=4))
    e.advance(10_000.0)
    # 900 reference-seconds left at (4/2)^0.8 speed, after a 30 s restart
    assert e.completed_at["a"] == pytest.approx(100 + 30 + 900 / 2**0.8)
    assert e.model("a").restarts == 1


def test_over_allocation_is_refused() -> None:
    e = engine(n=1)
    e.add_job("a", TraceJob(10.0, 4))
    e.add_job("b", TraceJob(10.0, 1))
    e.launch(req("a", gpus(n0=4)))
    with pytest.raises(CapacityError):
        e.launch(req("b", gpus(n0=1)))


def test_stop_keeps_progress_and_a_relaunch_resumes() -> None:
    e = engine()
    e.add_job("a", TraceJob(1000.0, 1))
    e.launch(req("a", gpus(n0=1)))
    e.advance(400.0)
    e.stop("a", 1)
    assert next(x for x in e.poll() if isinstance(x, JobExited)).exit_code == 0
    e.advance(1000.0)
    e.launch(req("a", gpus(n1=1), attempt=2))
    e.advance(5000.0)
    assert e.completed_at["a"] == pytest.approx(1000 + 30 + 600)


def test_node_loss_takes_its_jobs_down_and_the_node_comes_back() -> None:
    plan = FailurePlan(at=[(500.0, "n0")], repair_s=1000.0, checkpoint_interval_s=0.0)
    e = engine(failures=plan)
    e.add_job("a", TraceJob(5000.0, 1))
    e.launch(req("a", gpus(n0=1)))
    e.advance(600.0)
    ev = e.poll()
    assert any(isinstance(x, NodeLost) and x.node == "n0" and x.time == 500.0 for x in ev)
    assert any(isinstance(x, JobExited) and x.reason.startswith("node lost") for x in ev)
    assert e.alive() == {}
    e.launch(req("a", gpus(n0=1), attempt=2))
    assert any(isinstance(x, JobExited) and x.exit_code == -9 for x in e.poll())  # n0 still down
    e.advance(1600.0)
    assert any(isinstance(x, NodeUp) and x.node == "n0" for x in e.poll())


def test_cpu_jobs_share_a_node_by_weight_and_limit() -> None:
    e = SimEngine([NodeInfo("n0", 4.0)])
    for j in ("a", "b"):
        e.add_job(j, CpuJob(family_curve("cifar-resnet"), 10_000, startup_s=0.0))
    e.launch(req("a", Allocation.single("n0", 1.0)))
    e.launch(req("b", Allocation.single("n0", 1.0, cpu_limit=1.0)))
    e.advance(10.0)
    use = {x.job_id: x.cpu_cores for x in e.poll() if isinstance(x, JobUsage)}
    assert use["b"] == pytest.approx(1.0) and use["a"] == pytest.approx(3.0)


@given(
    cap=st.floats(0.5, 64),
    jobs=st.lists(st.tuples(st.floats(0.01, 8), st.floats(0.0, 16)), min_size=1, max_size=8),
)
def test_water_fill_respects_caps_and_wastes_nothing(cap: float, jobs: list[tuple[float, float]]) -> None:
    named = [(str(i), w, c) for i, (w, c) in enumerate(jobs)]
    out = water_fill(cap, named)
    assert sum(out.values()) <= cap + 1e-6
    for j, _, c in named:
        assert out[j] <= c + 1e-6
    if sum(out.values()) < cap - 1e-6:  # spare cores only when every job has all it can use
        assert all(out[j] >= c - 1e-6 for j, _, c in named)
