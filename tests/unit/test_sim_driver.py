"""The simulation driver runs the production Controller over the sim engine; the CLI on top."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluice.cli.main import app
from sluice.cli.sim import _gpus_per_node
from sluice.control.simulate import (
    FailurePlan,
    SimConfig,
    WorkloadJob,
    cpu_workload,
    pollux_data_dir,
    run_simulation,
)
from sluice.model import ORACLE_LABEL, ClusterView, Decision, JobView, NodeInfo
from sluice.policy.registry import make_policy
from sluice.sim.engine import SimEngine
from sluice.sim.jobs import TraceJob

DATA = pollux_data_dir()
"""The Pollux workloads (SLUICE_POLLUX_DATA): not shipped, so the test reproducing published JCTs skips without them."""


def trace(n: int) -> list[WorkloadJob]:
    return [
        WorkloadJob(f"j{i}", submit_time=30.0 * i, kind="trace", gpus=1 + i % 4, duration_s=600.0 + 300 * i)
        for i in range(n)
    ]


@pytest.mark.parametrize("policy", ["fifo", "binpack", "kube", "tiresias", "optimus", "pollux", "sluice"])
def test_every_gpu_policy_finishes_a_small_trace(policy: str) -> None:
    res = run_simulation(trace(8), policy, SimConfig(nodes=2, gpus_per_node=4, interval_s=60.0))
    assert len(res.finished) == 8
    for j in res.jobs:
        assert j.jct_s is not None and j.start_s is not None and j.start_s >= j.submit_s
    assert res.makespan_s >= max(j.jct_s or 0 for j in res.jobs)


def test_rigid_policy_jct_is_at_least_the_trace_duration() -> None:
    res = run_simulation(trace(6), "binpack", SimConfig(nodes=2, gpus_per_node=4))
    for wj, jr in zip(sorted(trace(6), key=lambda j: j.submit_time), res.jobs, strict=True):
        assert jr.jct_s is not None and jr.jct_s >= (wj.duration_s or 0)


def test_node_loss_is_survived_and_costs_time(tmp_path: Path) -> None:
    jobs = [WorkloadJob("long", 0.0, "trace", gpus=4, duration_s=3600.0)]
    clean = run_simulation(jobs, "binpack", SimConfig(nodes=2, gpus_per_node=4))
    fail = FailurePlan(at=[(600.0, "n0"), (600.0, "n1")], repair_s=600.0, checkpoint_interval_s=300.0, seed=1)
    hurt = run_simulation(jobs, "binpack", SimConfig(nodes=2, gpus_per_node=4, failures=fail))
    assert len(hurt.finished) == 1
    assert hurt.avg_jct_s > clean.avg_jct_s + 600.0  # waited for the repair, redid lost work


def test_cpu_jobs_report_qoe() -> None:
    res = run_simulation(cpu_workload(6, stagger_s=20.0), "dqoes", SimConfig(nodes=1, gpus_per_node=0, interval_s=10))
    met, total = res.qoe
    assert len(res.finished) == 6 and total > 0 and 0 <= met <= total


def test_cli_sim_run_prints_and_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    wl = tmp_path / "trace.csv"
    wl.write_text("job_id,submit_time,duration,gpu_num,user\na,0,600,2,u\nb,10,1200,4,u\nc,20,300,1,v\n")
    out, cdf = tmp_path / "r.json", tmp_path / "cdf.png"
    r = CliRunner().invoke(
        app,
        [
            "sim",
            "run",
            "--workload",
            str(wl),
            "--policy",
            "tiresias",
            "--nodes",
            "1",
            "--out",
            str(out),
            "--cdf",
            str(cdf),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "avg JCT" in r.output and "tiresias" in r.output
    rows = json.loads(out.read_text())
    assert {row["name"] for row in rows} == {"a", "b", "c"} and all(row["jct_s"] > 0 for row in rows)
    assert cdf.read_bytes()[:4] == b"\x89PNG"


def test_cli_sim_run_rejects_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["sim", "run", "--workload", str(tmp_path / "none.csv")])
    assert r.exit_code == 2 and "--workload" in r.output
    wl = tmp_path / "w.csv"
    wl.write_text("job_id,submit_time,duration,gpu_num\na,0,60,1\n")
    r = runner.invoke(app, ["sim", "run", "--workload", str(wl), "--policy", "nope"])
    assert r.exit_code == 2 and "--policy" in r.output
    r = runner.invoke(app, ["sim", "run", "--workload", str(wl), "--out", str(tmp_path / "x.txt")])
    assert r.exit_code == 2 and "--out" in r.output


@pytest.mark.skipif(not (DATA / "workloads").is_dir(), reason=f"Pollux data not found at {DATA}")
def test_tiresias_reproduces_the_published_jct_on_workload_1() -> None:
    from sluice.control.simulate import load_workload

    ref = json.loads((DATA / "results-jobload" / "tiresias-1.0" / "summary.json").read_text())["avgs"]["workload-1"]
    res = run_simulation(load_workload(DATA / "workloads" / "workload-1.csv"), "tiresias", SimConfig())
    assert len(res.finished) == 160
    assert abs(res.avg_jct_s / ref - 1.0) < 0.10


class _Recorder:
    """A policy that places every queued job at its request and records what it was shown."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[JobView] = []

    def decide(self, view: ClusterView) -> list[Decision]:
        self.seen.extend(view.jobs.values())
        return make_policy("binpack").decide(view)


def test_without_oracle_policies_see_no_ground_truth_only_reports() -> None:
    rec = _Recorder()
    res = run_simulation(trace(3), rec, SimConfig(nodes=1, gpus_per_node=4))
    assert len(res.finished) == 3 and not res.oracle and res.mode == "observed"
    assert rec.seen and all(j.oracle is None for j in rec.seen)
    # What a real engine would see: the steps and total the job reports, hence a prediction.
    running = [j for j in rec.seen if j.progress.step > 0]
    assert running and all(j.progress.total_steps for j in running)
    assert any(j.progress.predicted_remaining_s is not None for j in running)


def test_with_oracle_policies_see_the_simulators_ground_truth_and_results_say_so() -> None:
    rec = _Recorder()
    res = run_simulation(trace(3), rec, SimConfig(nodes=1, gpus_per_node=4, oracle=True))
    assert res.oracle and res.mode == ORACLE_LABEL and res.summary()["mode"] == ORACLE_LABEL
    assert all(row["mode"] == ORACLE_LABEL for row in res.rows())
    truths = [j.oracle for j in rec.seen]
    assert truths and all(t is not None for t in truths)
    first = next(j for j in rec.seen if j.name == "j0")
    assert first.oracle is not None and first.oracle.remaining_ref_s == pytest.approx(600.0)
    assert first.oracle.ref_gpus == 1 and first.oracle.speedup is not None


def test_the_engine_offers_ground_truth_only_when_built_with_oracle() -> None:
    nodes = [NodeInfo("n0", 8.0, 4)]
    assert SimEngine(nodes).oracle_source is None
    engine = SimEngine(nodes, oracle=True)
    engine.add_job("a", TraceJob(100.0, 2))
    assert engine.oracle_source is not None
    info = engine.oracle_source.oracle("a")
    assert info is not None and info.remaining_ref_s == 100.0 and info.ref_gpus == 2
    assert engine.oracle_source.oracle("unknown") is None


def test_oracle_and_observed_runs_differ_only_for_policies_that_estimate() -> None:
    """Rigid policies read only the spec: the oracle changes nothing for them."""
    jobs = trace(6)
    a = run_simulation(jobs, "tiresias", SimConfig(nodes=2, gpus_per_node=4))
    b = run_simulation(jobs, "tiresias", SimConfig(nodes=2, gpus_per_node=4, oracle=True))
    assert [j.finish_s for j in a.jobs] == [j.finish_s for j in b.jobs]


def test_cli_cpu_workload_gets_no_gpus_unless_asked_and_gpu_jobs_need_gpus(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["sim", "run", "--workload", "cpu:3:5", "--policy", "kube", "--nodes", "1"])
    assert r.exit_code == 0, r.output
    assert _gpus_per_node(cpu_workload(2), None) == 0
    assert _gpus_per_node(cpu_workload(2), 2) == 2  # asked for: given
    assert _gpus_per_node(trace(2), None) == 4
    wl = tmp_path / "trace.csv"
    wl.write_text("job_id,submit_time,duration,gpu_num,user\na,0,600,2,u\n")
    r = CliRunner().invoke(app, ["sim", "run", "--workload", str(wl), "--gpus-per-node", "0"])
    assert r.exit_code == 2 and "--gpus-per-node 0" in r.output


def test_cli_oracle_runs_are_labelled_upper_bounds(tmp_path: Path) -> None:
    wl = tmp_path / "trace.csv"
    wl.write_text("job_id,submit_time,duration,gpu_num,user\na,0,600,2,u\nb,10,1200,4,u\n")
    out = tmp_path / "r.json"
    args = ["sim", "run", "--workload", str(wl), "--policy", "sluice", "--nodes", "1", "--out", str(out)]
    r = CliRunner().invoke(app, [*args, "--oracle"])
    assert r.exit_code == 0, r.output
    assert ORACLE_LABEL in r.output and all(row["mode"] == ORACLE_LABEL for row in json.loads(out.read_text()))
    r = CliRunner().invoke(app, [*args, "--output", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["mode"] == "observed" and ORACLE_LABEL not in r.output
