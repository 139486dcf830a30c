"""The simulation driver runs the production Controller over the sim engine; the CLI on top."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluice.cli.main import app
from sluice.control.simulate import FailurePlan, SimConfig, WorkloadJob, cpu_workload, run_simulation

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "pollux"


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
