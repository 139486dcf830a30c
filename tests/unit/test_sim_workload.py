"""Workload readers: Pollux, Philly and Helios/Acme columns, windows and load factors, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.sim.workload import WorkloadError, cpu_workload, load_workload


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "w.csv"
    p.write_text(text)
    return p


def test_pollux_columns_and_load_factor(tmp_path: Path) -> None:
    p = write(tmp_path, "name,time,application,num_replicas,batch_size\na,100,cifar10,4,512\nb,50,ncf,1,256\n")
    jobs = load_workload(p)
    assert [j.name for j in jobs] == ["b", "a"]
    assert jobs[1].kind == "gpu" and jobs[1].gpus == 4 and jobs[1].batch_size == 512
    fast = load_workload(p, load_factor=2.0)
    assert [j.submit_time for j in fast] == [25.0, 50.0]


def test_helios_style_columns_plug_in(tmp_path: Path) -> None:
    p = write(tmp_path, "job_id,user,submit_time,duration,gpu_num,state\nx,alice,10,3600,8,COMPLETED\ny,bob,20,0,1,X\n")
    jobs = load_workload(p)
    assert len(jobs) == 1  # the zero-length record carries no GPU work
    assert jobs[0].kind == "trace" and jobs[0].user == "alice" and jobs[0].gpus == 8 and jobs[0].submit_time == 0.0


def test_philly_window_and_sampling(tmp_path: Path) -> None:
    rows = [f"2017-10-01 {h:02d}:00:00,60,1,60,c1" for h in range(24)]
    p = write(tmp_path, "timestamp,duration,num_gpus,gpu_time,cluster\n" + "\n".join(rows) + "\n")
    window = load_workload(p, window_start_h=2, window_hours=4)
    assert [j.submit_time for j in window] == [0.0, 3600.0, 7200.0, 10800.0]
    compressed = load_workload(p, window_start_h=2, window_hours=4, load_factor=2.0)
    assert compressed[-1].submit_time == 5400.0
    sampled = load_workload(p, load_factor=0.5, seed=1)
    assert 0 < len(sampled) < 24


def test_bad_files_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="unrecognised columns"):
        load_workload(write(tmp_path, "a,b\n1,2\n"))
    with pytest.raises(WorkloadError, match=r"w.csv:3: column 'time' must be a number"):
        load_workload(write(tmp_path, "name,time,application,num_replicas,batch_size\na,1,x,1,1\nb,soon,x,1,1\n"))
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload(tmp_path / "missing.csv")


def test_cpu_workload_is_reproducible_and_staggered() -> None:
    a, b = cpu_workload(8, stagger_s=15.0, seed=3), cpu_workload(8, stagger_s=15.0, seed=3)
    assert a == b
    assert [j.submit_time for j in a] == [15.0 * i for i in range(8)]
    targeted = [j for j in a if j.qoe_loss is not None]
    assert targeted and all(j.qoe_deadline_s and j.qoe_deadline_s > 0 for j in targeted)
