"""Learned speed-up curves: measured per allocation shape by the tracker (start-up excluded),
fitted per job, used by the GPU policies instead of one fixed curve for every job."""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.model import (
    Allocation,
    Assignment,
    ClusterView,
    JobView,
    NodeHealth,
    NodeView,
    OracleInfo,
    Phase,
    ProgressSignals,
    ProgressTracker,
    RateSample,
    Resize,
)
from sluice.model.progress import NOISE_WEIGHT
from sluice.policy.parts import speedup
from sluice.policy.parts.elastic import DEFAULT_REMAINING_S, DEFAULT_RESTART_S, Speedups, restart_s
from sluice.policy.parts.replicas import ReplicaSizer
from sluice.policy.parts.speedup import (
    EXPLORE_FACTOR,
    PHASE_FRACTION,
    PHASE_GROWTH,
    PRIOR_EXPONENT,
    STALE_S,
    LearnedCurve,
)
from sluice.policy.registry import make_policy


def sample(gpus: int, rate: float, at: float = 1000.0) -> RateSample:
    return RateSample(gpus, 1, gpus, rate, 120.0, at)


# ------------------------------------------------------------------ the tracker


def test_a_restart_is_not_counted_against_the_new_allocation() -> None:
    tr = ProgressTracker()
    one, two = (1, 1, 1), (2, 1, 2)
    for t in range(0, 301, 60):  # 1 GPU: 10 steps/s
        tr.report(float(t), 10 * t, None, shape=one, attempt=1)
    assert tr.snapshot().throughput == pytest.approx(10.0)
    # Resized at t=300; the first report after it comes 60 s later with 30 s lost to the restart.
    tr.report(360.0, 3000 + 30 * 16, None, shape=two, attempt=2)
    # The new shape has no measurement yet: the rate is not halved by the restart.
    assert tr.snapshot().throughput == pytest.approx(10.0)
    tr.report(420.0, 3000 + 30 * 16 + 60 * 16, None, shape=two, attempt=2)
    snap = tr.snapshot()
    assert snap.throughput == pytest.approx(16.0)
    rates = {(r.gpus, r.replicas): r.steps_per_s for r in snap.rates}
    assert rates == {(1, 1): pytest.approx(10.0), (2, 2): pytest.approx(16.0)}


def test_a_deliberate_restart_is_measured_from_the_reports_around_it() -> None:
    tr = ProgressTracker()
    one, two = (0, 1, 1), (0, 2, 2)
    for t in range(0, 301, 60):  # 10 steps/s
        tr.report(float(t), 10 * t, None, shape=one, attempt=1)
    tr.restarting()  # the controller resizes the job
    # Relaunched; 30 s of the next 60 lost, then 16 steps/s; the job restored the last report's step.
    tr.report(360.0, 3000 + 30 * 16, None, shape=two, attempt=2)
    assert tr.snapshot().restart_lost_s == ()  # the new size's rate is not measured yet
    tr.report(420.0, 3000 + 90 * 16, None, shape=two, attempt=2)
    assert tr.snapshot().restart_lost_s == (pytest.approx(30.0),)
    # Restored from an older checkpoint (100 steps behind): those steps are lost as well.
    tr.restarting()
    tr.report(480.0, 3000 + 90 * 16 - 100 + 20 * 10, None, shape=one, attempt=3)
    tr.report(540.0, 3000 + 90 * 16 - 100 + 80 * 10, None, shape=one, attempt=3)
    assert tr.snapshot().restart_lost_s == (pytest.approx(30.0), pytest.approx(40.0 + 10.0))


def test_failures_and_preemptions_are_not_counted_as_restart_costs() -> None:
    tr = ProgressTracker()
    for t in range(0, 301, 60):
        tr.report(float(t), 10 * t, None, shape=(0, 1, 1), attempt=1)
    # A new attempt nobody marked (a crash, or a preemption that waited in the queue for an hour).
    tr.report(3900.0, 3000 + 200, None, shape=(0, 1, 1), attempt=2)
    tr.report(3960.0, 3000 + 800, None, shape=(0, 1, 1), attempt=2)
    assert tr.snapshot().restart_lost_s == ()


def test_rates_are_measured_over_a_recent_window_within_one_allocation() -> None:
    tr = ProgressTracker()
    shape = (4, 1, 4)
    step = 0
    for t in range(0, 3601, 60):
        step += 60 * (1 if t <= 1800 else 3)  # the job speeds up halfway (larger batches pay off)
        tr.report(float(t), step, None, shape=shape, attempt=1)
    assert tr.snapshot().rates[0].steps_per_s == pytest.approx(3.0)


def test_a_job_reporting_many_times_a_second_is_measured_over_seconds_not_reports() -> None:
    """ddp.py reports every 20 steps: ~30 reports a second at 600 steps/s. The measured span
    must grow with time (policies judge a size only after 20 s of it), not stop at the last
    64 reports (2 s), or no policy ever resizes a fast job."""
    tr = ProgressTracker()
    for i in range(0, 30 * 40):  # 40 s at 30 reports/s, 20 steps each
        tr.report(i / 30.0, 20 * i, None, shape=(0, 1, 1), attempt=1)
    (r,) = tr.snapshot().rates
    assert r.seconds >= 35.0 and r.steps_per_s == pytest.approx(600.0)


def test_reports_without_a_shape_record_no_rate() -> None:
    tr = ProgressTracker()
    tr.report(0.0, 0, None)
    tr.report(60.0, 600, None)
    assert tr.snapshot().rates == () and tr.snapshot().throughput == pytest.approx(10.0)


# ------------------------------------------------------------------ the curve


def test_no_measurement_means_the_prior_and_no_more_than_asked() -> None:
    c = LearnedCurve([])
    assert not c.measured and c.rate(4) is None
    assert c.speedup(4, 1) == pytest.approx(4**PRIOR_EXPONENT)
    assert c.explore_cap(asked=3) == 3


def test_a_job_that_did_not_scale_is_predicted_not_to_scale() -> None:
    c = LearnedCurve([sample(1, 10.0), sample(2, 10.5)])
    assert c.speedup(4, 1) == pytest.approx(1.05 * 2 ** (c._slope((1, 10.0), (2, 10.5))), rel=1e-6)
    assert c.speedup(4, 1) < 1.2
    assert c.explore_cap(asked=1) == 2 * EXPLORE_FACTOR and c.explore_cap(asked=1, factor=2) == 4


def test_a_job_measured_below_its_request_may_still_get_what_it_asked_for() -> None:
    """Placed on 1 GPU of the 12 it asked for because the cluster was full: the one
    measurement must not cap it at EXPLORE_FACTOR GPUs, below its own request."""
    c = LearnedCurve([sample(1, 10.0)])
    assert c.explore_cap(asked=12) == max(12, EXPLORE_FACTOR)
    assert c.explore_cap(asked=1) == EXPLORE_FACTOR
    job = replace(_running("a", 1, (sample(1, 10.0),)), gpus=12, replicas_max=1)
    sp = Speedups(per_node=16)
    assert sp.most(job) == 12 > EXPLORE_FACTOR


def test_the_exploration_factor_is_read_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweeps (scripts/sweep_learned_curve.py) set the module constant; a default argument
    bound at import ignored them, so EXPLORE_FACTOR=8 and =4 ran the same simulation."""
    import sluice.policy.parts.speedup as speedup

    monkeypatch.setattr(speedup, "EXPLORE_FACTOR", 8)
    assert LearnedCurve([sample(2, 10.0)]).explore_cap(asked=1) == 16


def test_measured_points_are_used_exactly_and_interpolated_between() -> None:
    c = LearnedCurve([sample(1, 10.0), sample(4, 30.0)])
    assert c.rate(1) == 10.0 and c.rate(4) == 30.0
    assert 10.0 < c.rate(2) < 30.0  # type: ignore[operator]


def test_a_slower_allocation_is_never_extrapolated_downwards_or_super_linearly() -> None:
    slower = LearnedCurve([sample(2, 10.0), sample(4, 8.0)])
    assert slower.rate(8) == pytest.approx(8.0)  # slope clipped at 0 beyond what was seen
    steep = LearnedCurve([sample(1, 1.0), sample(2, 4.0)])
    assert steep.rate(8) == pytest.approx(4.0 * 4)  # clipped at linear


def test_below_the_fewest_gpus_measured_the_prior_scales_the_rate_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured flat from 8 to 16 GPUs (across nodes): that slope (0) would say a job shrunk
    to 2 GPUs keeps its speed — a free shrink. The prior exponent scales it down instead."""
    flat = [sample(8, 80.0), sample(16, 80.0)]
    c = LearnedCurve(flat)
    assert c.rate(2) == pytest.approx(80.0 * (2 / 8) ** PRIOR_EXPONENT)
    assert c.rate(16) == 80.0 and c.rate(32) == pytest.approx(80.0)  # above: the measured slope, as before
    assert c.speedup(2, 8) < 0.5
    # a CPU job's replica curve (one node, no boundary in it) keeps the measured slope
    assert LearnedCurve(flat, unit="replicas").rate(2) == pytest.approx(80.0)
    monkeypatch.setattr(speedup, "MEASURED_SLOPE_BELOW", True)  # the old rule
    assert LearnedCurve(flat).rate(2) == pytest.approx(80.0)


def test_old_measurements_are_forgotten() -> None:
    c = LearnedCurve([sample(8, 80.0, at=0.0), sample(1, 10.0, at=STALE_S + 10.0)])
    assert [g for g, _ in c.points] == [1]


def test_the_tracker_keeps_the_step_each_rate_was_measured_at() -> None:
    tr = ProgressTracker()
    for t in range(0, 301, 60):
        tr.report(float(t), 10 * t, None, shape=(1, 1, 1), attempt=1)
    (r,) = tr.snapshot().rates
    assert (r.at, r.step) == (300.0, 3000)


def test_a_measurement_from_an_earlier_phase_of_training_is_forgotten() -> None:
    """deepspeech2 measured on 12 GPUs in its first epoch runs no faster than on 1 (1.40 vs
    1.47 steps/s), and 6x faster a few epochs on; its 1-GPU rate never moves. Once the job is
    well past the step the 12-GPU point was made at, that point goes, well within STALE_S."""
    total = 28_536
    at = 100 + int(PHASE_FRACTION * total) + 10  # past both the growth and the fraction
    assert at > PHASE_GROWTH * 100
    early = RateSample(12, 3, 12, 1.40, 120.0, 1000.0, step=100)
    now = RateSample(1, 1, 1, 1.47, 120.0, 1400.0, step=at)
    assert [g for g, _ in LearnedCurve([early, now], total_steps=total).points] == [1]
    # not yet far enough on, or no declared total: kept (only STALE_S applies)
    soon = replace(now, step=100 + int(PHASE_FRACTION * total) - 10)
    assert [g for g, _ in LearnedCurve([early, soon], total_steps=total).points] == [1, 12]
    assert [g for g, _ in LearnedCurve([early, now]).points] == [1, 12]
    # a job's newest measurement is never from an earlier phase than itself
    assert [g for g, _ in LearnedCurve([replace(now, gpus=12, replicas=12)], total_steps=total).points] == [12]


def test_sluice_regrows_a_job_shrunk_on_a_measurement_from_its_first_epoch() -> None:
    """Without the phase rule the job stays on 1 GPU of an idle cluster for STALE_S: its curve
    says 12 GPUs are no faster than 1."""
    early = RateSample(12, 1, 12, 1.40, 120.0, 60.0, step=100)
    now = RateSample(1, 1, 1, 1.47, 120.0, 100.0, step=1000)
    job = replace(
        _running("a", 1, (early, now)),
        gpus=4,
        progress=ProgressSignals(step=1000, total_steps=28_536, throughput=1.47, rates=(early, now)),
    )
    d = {x.job_id: x for x in make_policy("sluice").decide(_view(job, gpus=16))}
    assert isinstance(d.get("a"), Resize) and d["a"].allocation.total_gpus > 1


@given(
    st.lists(st.tuples(st.integers(1, 64), st.floats(0.01, 1e4)), min_size=1, max_size=8, unique_by=lambda x: x[0]),
    st.integers(1, 64),
)
def test_predictions_are_positive_and_bounded_by_linear_extrapolation(pts: list[tuple[int, float]], n: int) -> None:
    c = LearnedCurve([sample(g, r) for g, r in pts])
    r = c.rate(n)
    assert r is not None and r > 0
    hi = max(rate * max(1.0, n / g) for g, rate in pts)
    assert r <= hi * (1 + 1e-9)


# ------------------------------------------------------------------ policies


def _view(*jobs: JobView, gpus: int = 8) -> ClusterView:
    ns = {"n0": NodeView("n0", 32.0, gpus, health=NodeHealth.HEALTHY)}
    return ClusterView(100.0, MappingProxyType(ns), MappingProxyType({j.id: j for j in jobs}))


def _running(jid: str, held: int, rates: tuple[RateSample, ...]) -> JobView:
    alloc = Allocation((Assignment("n0", float(held), None, held),))
    return JobView(
        id=jid,
        tenant="t",
        name=jid,
        phase=Phase.RUNNING,
        submitted_at=0.0,
        gpus=1,
        replicas_min=1,
        replicas_max=8,
        allocation=alloc,
        progress=ProgressSignals(step=100, total_steps=100_000, throughput=rates[-1].steps_per_s, rates=rates),
    )


@pytest.mark.parametrize("policy", ["sluice", "pollux"])
def test_policies_grow_the_job_that_scales_not_the_one_that_does_not(policy: str) -> None:
    scales = _running("scales", 2, (sample(1, 10.0), sample(2, 19.0)))
    flat = _running("flat", 2, (sample(1, 10.0), sample(2, 10.2)))
    ds = {d.job_id: d for d in make_policy(policy).decide(_view(scales, flat, gpus=6))}
    after = {j: d.allocation.total_gpus if isinstance(d, Resize) else 2 for j, d in ds.items()}
    # the scaling job grows into the free GPUs (and what the flat one does not need)
    assert after.get("scales", 2) > 2 >= after.get("flat", 2)


def test_hysteresis_holds_a_small_gain_back_only_while_the_gpus_are_busy() -> None:
    """3 GPUs measured 3 % faster than 2: worth a restart on an idle cluster, not while the
    GPUs are mostly held (where a wrong guess takes a GPU from another job)."""
    small = (sample(1, 10.0), sample(2, 19.0), sample(3, 19.6))
    a = _running("a", 2, small)
    idle = {d.job_id: d for d in make_policy("sluice").decide(_view(a, gpus=8))}
    assert isinstance(idle.get("a"), Resize) and idle["a"].allocation.total_gpus >= 3
    b = _running("b", 5, (sample(1, 10.0), sample(4, 40.0), sample(5, 50.0)))
    busy = {d.job_id: d for d in make_policy("sluice").decide(_view(a, b, gpus=8))}
    assert not isinstance(busy.get("a"), Resize) or busy["a"].allocation.total_gpus == 2
    with pytest.raises(ValueError, match="busy_fraction"):
        make_policy("sluice", busy_fraction=1.5)


def test_the_prior_baseline_treats_both_alike() -> None:
    scales = _running("scales", 2, (sample(1, 10.0), sample(2, 19.0)))
    flat = _running("flat", 2, (sample(1, 10.0), sample(2, 10.2)))
    sp = Speedups(per_node=8, learn=False)
    assert sp(scales, 4) == sp(replace(flat, id="scales2"), 4) == pytest.approx(4**PRIOR_EXPONENT)
    assert sp.most(flat) == 8


def test_an_unknown_length_grows_with_the_service_attained() -> None:
    fresh = replace(_running("a", 2, (sample(2, 10.0),)), progress=ProgressSignals())
    sp = Speedups(per_node=8)
    assert sp.remaining_ref_s(fresh) == DEFAULT_REMAINING_S
    old = replace(fresh, id="b", attained_service=5 * 3600.0)
    assert sp.remaining_ref_s(old) == pytest.approx(5 * 3600.0)


# ------------------------------------------------------------------ CPU replicas


def _cpu_job(n: int, rates: tuple[RateSample, ...], *, lo: int = 1, hi: int = 4, total: int = 100_000) -> JobView:
    alloc = Allocation(tuple(Assignment(f"c{k % 2}", 1.0) for k in range(n)))
    return JobView(
        id="ddp",
        tenant="t",
        name="ddp",
        phase=Phase.RUNNING,
        submitted_at=0.0,
        cpu_min=1.0,
        gpus=0,
        replicas_min=lo,
        replicas_max=hi,
        allocation=alloc,
        progress=ProgressSignals(step=100, total_steps=total, rates=rates),
    )


def _cpu_view(job: JobView, cores: float = 4.0) -> ClusterView:
    ns = {f"c{i}": NodeView(f"c{i}", cores / 2, 0, health=NodeHealth.HEALTHY) for i in range(2)}
    return ClusterView(100.0, MappingProxyType(ns), MappingProxyType({job.id: job}))


def rep(n: int, rate: float, seconds: float = 60.0) -> RateSample:
    return RateSample(0, min(n, 2), n, rate, seconds, 1000.0)


def test_an_elastic_cpu_job_explores_a_size_the_prior_says_is_faster() -> None:
    j = _cpu_job(1, (rep(1, 10.0),))
    ds = ReplicaSizer("sluice").decide(_cpu_view(j))
    assert len(ds) == 1 and len(ds[0].allocation.assignments) == 2  # at most twice the most measured
    assert "1 -> 2 replicas" in ds[0].reason and "1: 10" in ds[0].reason


def test_a_size_measured_slower_is_left_for_the_faster_one() -> None:
    j = _cpu_job(2, (rep(1, 10.0), rep(2, 4.0)))
    ds = ReplicaSizer("sluice").decide(_cpu_view(j))
    assert len(ds) == 1 and len(ds[0].allocation.assignments) == 1


def test_no_resize_before_the_current_size_is_measured_nor_when_it_would_not_pay() -> None:
    assert ReplicaSizer("sluice").decide(_cpu_view(_cpu_job(1, (rep(1, 10.0, seconds=5.0),)))) == []
    nearly_done = _cpu_job(1, (rep(1, 10.0),), total=200)  # 10 s left: a 30 s resize cannot pay
    assert ReplicaSizer("sluice").decide(_cpu_view(nearly_done)) == []
    no_room = _cpu_job(1, (rep(1, 10.0),))
    assert ReplicaSizer("sluice").decide(_cpu_view(no_room, cores=1.0)) == []


def test_a_measured_restart_cost_replaces_the_assumed_one() -> None:
    # 150 s left at 10 steps/s; 2 replicas predicted 1.74x: 86 s + 30 s assumed < 150: explore.
    # With 2000 steps left: 200 s vs 200/1.74*1.05 + 30 = 151 s: explore; measured 80 s: do not.
    assumed = _cpu_job(1, (rep(1, 10.0),), total=2100)
    ds = ReplicaSizer("sluice").decide(_cpu_view(assumed))
    assert len(ds) == 1 and "resize cost 30.0s assumed" in ds[0].reason
    slow = replace(assumed, progress=replace(assumed.progress, restart_lost_s=(70.0, 80.0, 200.0)))
    assert ReplicaSizer("sluice").decide(_cpu_view(slow)) == []
    # A job nearly done for the assumed cost still resizes where its restarts cost 2 s.
    short = _cpu_job(1, (rep(1, 10.0),), total=500)  # 40 s left
    assert ReplicaSizer("sluice").decide(_cpu_view(short)) == []
    quick = replace(short, progress=replace(short.progress, restart_lost_s=(2.0,)))
    ds = ReplicaSizer("sluice").decide(_cpu_view(quick))
    assert len(ds) == 1 and "resize cost 2.0s measured" in ds[0].reason


def test_restart_cost_is_the_oracle_then_the_median_measured_then_the_default() -> None:
    j = _cpu_job(1, (rep(1, 10.0),))
    assert restart_s(j) == DEFAULT_RESTART_S and restart_s(j, 5.0) == 5.0
    measured = replace(j, progress=replace(j.progress, restart_lost_s=(4.0, 100.0, 6.0, 5.0)))
    assert restart_s(measured) == pytest.approx(5.5)
    told = replace(measured, oracle=OracleInfo(remaining_ref_s=10.0, restart_s=12.0))
    assert restart_s(told) == 12.0


def test_the_sluice_policy_resizes_elastic_cpu_jobs() -> None:
    j = _cpu_job(2, (rep(1, 10.0), rep(2, 4.0)))
    ds = [d for d in make_policy("sluice").decide(_cpu_view(j)) if d.job_id == "ddp"]
    assert len(ds) == 1 and isinstance(ds[0], Resize) and len(ds[0].allocation.assignments) == 1


def test_job_get_shows_the_measured_rates() -> None:
    from sluice.cli.job import _rates

    rates = [
        {"gpus": 0, "nodes": 1, "replicas": 1, "steps_per_s": 10.0, "seconds": 60, "at": 1},
        {"gpus": 0, "nodes": 2, "replicas": 2, "steps_per_s": 4.25, "seconds": 60, "at": 2},
    ]
    assert _rates(rates) == "1 replica: 10; 2 replicas: 4.25"


# ------------------------------------------------------------------ the gradient noise scale


def test_efficiency_and_the_noise_factor() -> None:
    from sluice.policy.parts.speedup import efficiency, noise_factor

    assert efficiency(64, 1000.0, 64) == pytest.approx(1.0)
    assert efficiency(1024, 1000.0, 64) == pytest.approx(1064 / 2024)
    # the same noise then and now, or the reference batch itself: nothing to carry
    assert noise_factor(1024, 500.0, 500.0, 64) == pytest.approx(1.0)
    assert noise_factor(64, 100.0, 5000.0, 64) == pytest.approx(1.0)
    # the noise grew: a large batch gains, and more than a smaller one
    assert noise_factor(1024, 100.0, 5000.0, 64) > noise_factor(256, 100.0, 5000.0, 64) > 1.0


def test_the_tracker_keeps_the_noise_scale_each_rate_was_measured_at() -> None:
    tr = ProgressTracker()
    one = (1, 1, 1)
    for t in range(0, 181, 60):
        tr.report(float(t), 10 * t, None, {"grad_noise_scale": 100.0 + t, "gns_batch": 64.0, "ref_batch": 64.0}, one, 1)
    # a running geometric mean of what was reported (NOISE_WEIGHT on the newest)
    want = 100.0
    for phi in (160.0, 220.0, 280.0):
        want = math.exp((1 - NOISE_WEIGHT) * math.log(want) + NOISE_WEIGHT * math.log(phi))
    snap = tr.snapshot()
    (r,) = snap.rates
    assert r.noise_scale == pytest.approx(want) and r.batch == 64.0 and 100.0 < want < 280.0
    assert snap.noise_scale == pytest.approx(want) and snap.ref_batch == 64.0
    # a report without them, or with nonsense, keeps the last good values
    for bad in (
        {},
        {"grad_noise_scale": -1.0, "gns_batch": 64.0},
        {"grad_noise_scale": float("nan"), "gns_batch": 1.0},
        {"grad_noise_scale": 5.0, "gns_batch": float("inf"), "ref_batch": 0.0},
        {"grad_noise_scale": 1e308, "gns_batch": 1e308, "ref_batch": 1e308},
    ):
        tr.report(240.0 + len(bad), 2400, None, bad, one, 1)
    snap = tr.snapshot()
    assert snap.noise_scale == pytest.approx(want) and snap.ref_batch == 64.0
    assert ProgressTracker().snapshot().noise_scale is None
    # what was kept cannot break the curve's arithmetic
    carried = LearnedCurve(snap.rates, noise_now=snap.noise_scale, ref_batch=snap.ref_batch)
    assert all(math.isfinite(r) for _, r in carried.points)


def _noisy(gpus: int, rate: float, phi: float, batch: float) -> RateSample:
    return RateSample(gpus, 1, gpus, rate, 120.0, 1000.0, phi, batch)


def test_a_curve_carries_old_rates_to_todays_noise_scale() -> None:
    # 1 GPU at the reference batch, 16 GPUs at 16x the batch, both measured when the noise was 100
    pts = [_noisy(1, 10.0, 100.0, 64.0), _noisy(16, 40.0, 100.0, 1024.0)]
    as_measured = LearnedCurve(pts)
    carried = LearnedCurve(pts, noise_now=5000.0, ref_batch=64.0)
    assert as_measured.speedup(16, 1) == pytest.approx(4.0)
    # the 1-GPU rate is at the reference batch (unchanged); the 16-GPU one gains
    assert carried.rate(1) == pytest.approx(10.0)
    assert carried.speedup(16, 1) == pytest.approx(4.0 * (5064 / 6024) / (164 / 1124))
    # a job that does not say what its steps are counted in keeps its rates as measured
    assert LearnedCurve(pts, noise_now=5000.0).speedup(16, 1) == pytest.approx(4.0)


def test_carrying_rates_to_the_current_noise_scale_is_an_option() -> None:
    prog = ProgressSignals(
        rates=(_noisy(1, 10.0, 100.0, 64.0), _noisy(16, 40.0, 100.0, 1024.0)), noise_scale=5000.0, ref_batch=64.0
    )
    job = JobView(
        id="j",
        tenant="t",
        name="j",
        phase=Phase.RUNNING,
        submitted_at=0.0,
        gpus=1,
        replicas_min=1,
        replicas_max=16,
        progress=prog,
    )
    assert Speedups(4, carry_noise=False)(job, 16) == pytest.approx(4.0)
    assert Speedups(4, carry_noise=True)(job, 16) > 4.0 * 5
    assert make_policy("sluice").carry_noise is False  # type: ignore[attr-defined]
    assert make_policy("sluice", carry_noise=True).carry_noise is True  # type: ignore[attr-defined]


def test_sluice_looks_past_a_measured_dip_but_never_lands_in_it() -> None:
    """Goodput often falls when a job first spans a second node and rises beyond: measured at
    1 GPU 12 steps/s, at 4 40, at 5 30 (the dip), at 8 75. One GPU more is a loss, so judging one GPU
    at a time (`lookahead="none"`) never grows it; judged against the counts it was measured
    at, it grows to 8 — and where only 5 are to be had it stays at 4, not in the dip."""
    dip = (sample(1, 12.0), sample(4, 40.0), sample(5, 30.0), sample(8, 75.0))
    a = _running("a", 4, dip)

    def after(gpus: int, lookahead: str) -> int:
        ds = {d.job_id: d for d in make_policy("sluice", lookahead=lookahead).decide(_view(a, gpus=gpus))}
        d = ds.get("a")
        return d.allocation.total_gpus if isinstance(d, Resize) else 4

    assert after(8, "none") == 4
    assert after(8, "measured") == 8
    assert after(5, "measured") == 4
    with pytest.raises(ValueError, match="lookahead must be one of"):
        make_policy("sluice", lookahead="everything")


def test_the_newest_measurement_is_kept_when_a_job_starts_over_at_a_lower_step() -> None:
    """The phase rule is relative to the newest measurement (by time), so that one is always
    kept. It was measured against the highest step any kept sample was made at: a job that
    went back in its steps — restarted without a checkpoint, or one that counts its steps
    from 0 in each attempt — lost its fresh measurement on its new shape to the old attempt's
    points, and the policy saw only the shapes measured before the restart."""
    total = 10_000
    old = RateSample(1, 1, 1, 2.0, 120.0, 1000.0, step=5000)  # attempt 1, far in
    fresh = RateSample(4, 1, 4, 6.0, 120.0, 1300.0, step=300)  # attempt 2, from step 0, on 4 GPUs
    assert [g for g, _ in LearnedCurve([old, fresh], total_steps=total).points] == [1, 4]
    # through the tracker: the second attempt counts from 0 again
    tr = ProgressTracker()
    tr.total_steps = total
    for t in range(0, 2501, 60):
        tr.report(float(t), 2 * t, None, shape=(1, 1, 1), attempt=1)
    for t in range(2600, 2801, 20):
        tr.report(float(t), 6 * (t - 2600), None, shape=(4, 1, 4), attempt=2)
    curve = LearnedCurve(tr.snapshot().rates, total_steps=total)
    assert 4 in [g for g, _ in curve.points]
