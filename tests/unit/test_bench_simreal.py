"""`sluice bench simreal`: the simulator's twin of the real mixed workload, the measured CPU
model it runs on (profiles over the cores a job really got, start-up as CPU work), and the
command's report. The real runs themselves are a benchmark (docs/benchmarks.md), not a test:
here they come from a saved file through --real-from."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluice.bench.scenario import mixed_workload
from sluice.bench.simreal import example_of, sim_workload
from sluice.cli.main import app
from sluice.control.profile import ProfileRun, curve_points, fit_startup, save_profile
from sluice.control.simulate import SimConfig, WorkloadJob, run_simulation
from sluice.model import Allocation, JobRecord
from sluice.sim.cpu_profiles import load_curve
from sluice.sim.jobs import CpuCurve, CpuJob

DEFAULT_STEPS = {"mlp": 18_000, "cnn": 6_000, "lstm": 2_500, "autoencoder": 40_000}


def _profiles(tmp: Path) -> Path:
    """Saved profiles for the four examples, as `sluice sim profile` writes them."""
    d = tmp / "profiles"
    d.mkdir()
    for i, (ex, total) in enumerate(DEFAULT_STEPS.items()):
        (d / f"{ex}.profile.json").write_text(
            json.dumps(
                {
                    "cores": [0.5, 1.0],
                    "steps_per_s": [50.0 * (i + 1), 100.0 * (i + 1)],
                    "loss_start": 2.0,
                    "loss_floor": 0.1,
                    "loss_half_steps": 50.0,
                    "startup_cpu_s": 2.0,
                    "startup_wait_s": 0.5,
                    "total_steps": total,
                }
            )
        )
    return d


def test_the_sim_workload_has_the_real_jobs_arrivals_requests_and_steps(tmp_path: Path) -> None:
    arrivals = mixed_workload(stagger_s=3.0, scale=0.01)
    d = _profiles(tmp_path)
    jobs = sim_workload(arrivals, {ex: d / f"{ex}.profile.json" for ex in DEFAULT_STEPS})
    assert [j.name for j in jobs] == [a.spec.name for a in arrivals]
    assert [j.submit_time for j in jobs] == [a.at_s for a in arrivals]
    assert [j.cpus for j in jobs] == [a.spec.resources.cpu.min for a in arrivals] == [0.25] * 6
    assert [j.cpu_max for j in jobs] == [a.spec.resources.cpu.max for a in arrivals] == [2.0] * 6
    # The examples' own rule: ceil(default steps x EXAMPLE_SCALE).
    assert [j.cpu_steps for j in jobs] == [math.ceil(DEFAULT_STEPS[example_of(a)] * 0.01) for a in arrivals]
    assert all(
        j.kind == "cpu" and j.cpu_profile and example_of(a) in j.cpu_profile
        for j, a in zip(jobs, arrivals, strict=True)
    )


def test_measured_start_up_is_cpu_work_that_stretches_under_contention() -> None:
    curve = CpuCurve((1.0,), (100.0,), startup_cpu_s=2.0, startup_wait_s=1.0)
    alone, shared = CpuJob(curve, 1000), CpuJob(curve, 1000)
    for job in (alone, shared):
        job.place(Allocation.single("n0", 0.25))
    assert alone.cpu_demand(Allocation.single("n0", 0.25)) == 1.0  # one interpreter thread importing
    # 1 s fixed + 2 CPU-s on one core = 3 s before the first step; on half a core, 1 + 4 = 5 s.
    assert alone.advance(3.0, 1.0) is None and alone.done_steps == 0 and alone.startup_work_left == 0
    assert shared.advance(3.0, 0.5) is None and shared.startup_work_left == pytest.approx(1.0)
    assert alone.advance(1.0, 1.0) is None and alone.done_steps == pytest.approx(100.0)
    assert shared.advance(2.0, 0.5) is None and shared.done_steps == 0 and shared.startup_work_left == 0
    assert shared.advance(1.0, 0.5) is None and shared.done_steps == pytest.approx(50.0)
    # Without a measured start-up the old fixed pause applies (parametric families unchanged).
    fixed = CpuJob(CpuCurve((1.0,), (100.0,)), 1000, startup_s=5.0)
    fixed.place(Allocation.single("n0", 1.0))
    fixed.advance(6.0, 1.0)
    assert fixed.done_steps == pytest.approx(100.0)


def test_profile_curve_is_over_the_cores_the_job_got_and_start_up_is_fitted() -> None:
    # A one-thread job on a busy machine: at limit 1 it got 0.4 cores, at limit 2 only 0.42.
    runs = [
        ProfileRun(0.25, 25.0, startup_s=0.5 + 2.0 / 0.25, cores_used=0.25, threads=1),
        ProfileRun(1.0, 40.0, startup_s=0.5 + 2.0 / 0.4, cores_used=0.4, threads=1),
        ProfileRun(2.0, 44.0, startup_s=0.5 + 2.0 / 0.42, cores_used=0.42, threads=1),
    ]
    cores, steps = curve_points(runs)
    # 0.4 and 0.42 merge; then carried on at its steps per core-second to the one core one thread can use.
    assert cores == pytest.approx((0.25, 0.41, 1.0))
    assert steps == pytest.approx((25.0, 42.0, 42.0 / 0.41))
    fit = fit_startup(runs)
    assert fit is not None
    assert fit[0] == pytest.approx(2.0) and fit[1] == pytest.approx(0.5)
    # Start-up CPU read from the process's CPU times wins over the fit; the rest is fixed wait.
    direct = [ProfileRun(r.cores, r.steps_per_s, [], r.startup_s, r.cores_used, None, 1, 2.0) for r in runs]
    assert fit_startup(direct) == pytest.approx((2.0, 0.5))
    direct[0].startup_cpu_s = direct[1].startup_cpu_s = 9.0  # the median; wall time left over: none
    assert fit_startup(direct) == pytest.approx((9.0, 0.0))
    # Where usage was not measured, the limit stands (a quiet machine's reading).
    assert curve_points([ProfileRun(0.5, 10.0), ProfileRun(1.0, 20.0)]) == ((0.5, 1.0), (10.0, 20.0))


def test_simreal_prints_real_and_simulated_side_by_side(tmp_path: Path) -> None:
    d = _profiles(tmp_path)
    arrivals = mixed_workload(stagger_s=2.0, scale=0.01)
    real = [
        {
            "policy": policy,
            "node_cpus": 2.0,
            "background_cores": 0.5,
            "real": {
                "avg_jct_s": 9.0,
                "makespan_s": 20.0,
                "jobs": [{"name": a.spec.name, "jct_s": 8.0 + i} for i, a in enumerate(arrivals)],
            },
        }
        for policy in ("kube", "sluice")
    ]
    saved = tmp_path / "real.json"
    saved.write_text(json.dumps(real))
    out = tmp_path / "out.json"
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "simreal",
            "--policies",
            "kube,sluice",
            "--scale",
            "0.01",
            "--stagger",
            "2",
            "--profiles",
            str(d),
            "--real-from",
            str(saved),
            "--out",
            str(out),
        ],
        env={"COLUMNS": "250"},
    )
    assert r.exit_code == 0, r.output
    assert "avg JCT real (s)" in r.output and "avg JCT sim (s)" in r.output and "not a quiet one" in r.output
    rows = json.loads(out.read_text())
    assert [c["policy"] for c in rows] == ["kube", "sluice"]
    for c in rows:
        sims = {j["name"]: j["jct_s"] for j in c["sim"]["jobs"]}
        assert set(sims) == {a.spec.name for a in arrivals}
        # Every simulated job ran its measured start-up (0.5 s + 2 CPU-s) and its steps, and finished.
        assert all(v is not None and v > 2.5 for v in sims.values())
        assert c["background_cores"] == 0.5


def test_saved_profile_round_trips_the_measured_start_up(tmp_path: Path) -> None:
    d = _profiles(tmp_path)
    curve = load_curve(d / "mlp.profile.json")
    assert (curve.startup_cpu_s, curve.startup_wait_s) == (2.0, 0.5)


def test_a_saved_profile_records_the_load_average_it_was_measured_under(tmp_path: Path) -> None:
    # docs/simulator.md: the profile keeps "the load average at the time", for `sluice sim
    # profile` as for `bench simreal`'s own profiles (only the latter used to write it).
    runs = [ProfileRun(0.5, 100.0, cores_used=0.5, threads=1, total_steps=1000), ProfileRun(1.0, 190.0)]
    curve = CpuCurve((0.5, 1.0), (100.0, 190.0))
    save_profile(curve, runs, tmp_path / "a.profile.json", "examples/mlp.yaml", 3.0)
    saved = json.loads((tmp_path / "a.profile.json").read_text())
    assert isinstance(saved["load_average"], float) and saved["load_average"] >= 0
    assert saved["total_steps"] == 1000 and saved["limits"] == [0.5, 1.0]
    save_profile(curve, runs, tmp_path / "b.profile.json", "examples/mlp.yaml", 3.0, load_average=1.25)
    assert json.loads((tmp_path / "b.profile.json").read_text())["load_average"] == 1.25


def test_background_load_is_replayed_sample_by_sample_and_policies_see_the_full_node(tmp_path: Path) -> None:
    prof = tmp_path / "one.profile.json"
    prof.write_text(json.dumps({"cores": [1.0], "steps_per_s": [100.0], "startup_cpu_s": 0.0}))
    job = WorkloadJob("j", 0.0, "cpu", gpus=0, cpu_profile=str(prof), cpu_steps=1500, cpus=0.25, cpu_max=1.0)
    seen: list[float] = []

    def observe(now: float, live: list[JobRecord]) -> None:
        seen.extend(a.cpu_request for j in live if j.allocation for a in j.allocation.assignments)

    def jct(background: float | tuple[tuple[float, float], ...]) -> float:
        cfg = SimConfig(nodes=1, gpus_per_node=0, cpus_per_node=1.0, interval_s=0.5, background_cpu=background)
        res = run_simulation([job], "kube", cfg, observe=observe)
        assert res.jobs[0].jct_s is not None
        return res.jobs[0].jct_s

    assert jct(0.0) == pytest.approx(15.0)  # 1500 steps at 100/s on the whole core
    # Half the core busy for the first 10 s (500 steps), then free: 10 + 10 s.
    assert jct(((10.0, 0.5), (10.5, 0.0))) == pytest.approx(20.0)
    assert jct(0.5) == pytest.approx(30.0)  # a constant background: half the core all along
    assert seen and all(r == 0.25 for r in seen)  # placed as on a 1-core node: the request, no shrinking
