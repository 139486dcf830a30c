"""The measured Pollux application models (the set shipped in the package: runs on a fresh clone)."""

from __future__ import annotations

import csv

import pytest

from sluice.sim.apps import RESTART_PENALTY_S, SHIPPED_MODELS, Application, load_applications


@pytest.fixture(scope="module")
def apps() -> dict[str, Application]:
    return load_applications(str(SHIPPED_MODELS))


def test_epochs_and_batch_limits_follow_the_artifact(apps: dict[str, Application]) -> None:
    assert {n: a.max_epochs for n, a in apps.items()} == {
        "bert": 2,
        "cifar10": 100,
        "deepspeech2": 80,
        "imagenet": 90,
        "ncf": 10,
        "yolov3": 50,
    }
    assert apps["yolov3"].max_local_bsz == 8
    assert apps["cifar10"].init_batch_size == 128


def test_measured_step_times_are_returned_exactly(apps: dict[str, Application]) -> None:
    with (SHIPPED_MODELS / "cifar10" / "placements.csv").open() as f:
        row = next(r for r in csv.DictReader(f) if r["placement"] == "44")
    st, sy = apps["cifar10"].step_time((4, 4), int(row["local_bsz"]))
    assert st == pytest.approx(float(row["step_time"])) and sy == pytest.approx(float(row["sync_time"]))
    # an unmeasured placement is interpolated to something finite and positive
    st2, _ = apps["cifar10"].step_time((1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), 64)
    assert 0 < st2 < 10


def test_statistical_efficiency_gain(apps: dict[str, Application]) -> None:
    app = apps["cifar10"]
    assert app.gain(0, app.init_batch_size) == pytest.approx(1.0)
    g = [app.gain(10, b) for b in (128, 256, 1024, 4096)]
    assert g == sorted(g)  # bigger batches make more progress per step...
    assert all(gi <= b / 128 + 1e-9 for gi, b in zip(g, (128, 256, 1024, 4096), strict=True))  # ...never linearly more


def test_fixed_batch_accumulates_when_a_gpu_cannot_hold_its_share(apps: dict[str, Application]) -> None:
    cfg = apps["yolov3"].fixed_config(2, 64)
    assert cfg.atomic_bsz <= 8 and cfg.batch_size == 64 and cfg.accum_steps == 3


def test_a_lone_job_takes_the_sum_of_its_epochs_plus_one_restart(apps: dict[str, Application]) -> None:
    from sluice.model import Allocation, Assignment
    from sluice.sim.jobs import GpuAppJob

    app = apps["ncf"]
    job = GpuAppJob(app, 256, 1)
    job.place(Allocation((Assignment("n0", 1.0, None, 1),)))
    expected = RESTART_PENALTY_S
    for e in range(app.max_epochs):
        cfg = app.fixed_config(1, 256)
        expected += (app.progress_at(e + 1) - app.progress_at(e)) / app.goodput((1,), cfg, e)
    used = job.advance(10 * expected, 0.0)
    assert used == pytest.approx(expected) and job.done


def test_the_reported_noise_scale_reproduces_the_simulated_efficiency(apps: dict[str, Application]) -> None:
    """What a simulated job reports (its gradient noise scale, batch and reference batch) is
    enough to recompute the statistical efficiency the simulator runs it at: the policy's
    model (`speedup.efficiency`) and the simulator's (`Application.gain`) are one model."""
    from sluice.model import Allocation, Assignment
    from sluice.policy.parts.speedup import efficiency
    from sluice.sim.jobs import GpuAppJob

    app = apps["cifar10"]
    job = GpuAppJob(app, app.init_batch_size, 4, adaptive=True)
    assert job.noise_metrics() == {}  # no GPUs, nothing measured
    job.place(Allocation((Assignment("n0", 1.0, None, 4),)))
    for epoch in (0, 30, 90):
        job.epoch = epoch
        job.cfg = job._config(job.placement)
        m = job.noise_metrics()
        b, b0 = m["gns_batch"], m["ref_batch"]
        assert b == job.cfg.batch_size and b0 == app.init_batch_size
        assert (b / b0) * efficiency(b, m["grad_noise_scale"], b0) == pytest.approx(app.gain(epoch, int(b)))
    # the noise grows as training goes on (why larger batches pay off later)
    early = GpuAppJob(app, app.init_batch_size, 4, adaptive=True)
    early.place(Allocation((Assignment("n0", 1.0, None, 4),)))
    assert m["grad_noise_scale"] > early.noise_metrics()["grad_noise_scale"]
