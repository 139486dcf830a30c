"""SPOT: the extreme-value threshold matches the risk it is asked for."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.health.spot import Spot, fit_gpd


def test_gpd_fit_recovers_an_exponential_tail() -> None:
    rng = np.random.default_rng(1)
    gamma, sigma = fit_gpd(rng.exponential(2.0, 5000))
    assert abs(gamma) < 0.1
    assert sigma == pytest.approx(2.0, rel=0.1)


def test_threshold_exceedance_rate_is_close_to_q() -> None:
    rng = np.random.default_rng(2)
    spot = Spot(q=1e-3, level=0.98).fit(rng.normal(size=20000))
    fresh = rng.normal(size=200000)
    rate = float((fresh > spot.threshold).mean())
    assert 2e-4 < rate < 4e-3
    # The threshold lies far beyond the initial quantile, as a tail extrapolation should.
    assert spot.threshold > spot.init


def test_streaming_flags_outliers_and_does_not_learn_from_them() -> None:
    rng = np.random.default_rng(3)
    spot = Spot(q=1e-3).fit(rng.normal(size=5000))
    before = spot.threshold
    assert spot.step(before + 10.0) is True
    assert spot.threshold == before  # an alarm never raises the bar
    assert spot.step(0.0) is False
    restored = Spot.from_dict(spot.to_dict())
    assert restored.threshold == pytest.approx(spot.threshold, rel=1e-3)


def test_fit_rejects_no_scores() -> None:
    with pytest.raises(ValueError, match="finite calibration score"):
        Spot().fit(np.array([np.nan]))


def test_ceiling_bounds_a_heavy_tailed_fit_so_faults_still_alarm() -> None:
    # A dozen calm scores with one stray: the GPD fit on so few excesses can extrapolate the
    # threshold to absurd heights (1e20 in the e2e test), and every fault score below it then
    # becomes a healthy "peak" that SPOT learns.
    calm = np.array([-0.9, -0.92, -0.88, -0.91, -0.9, -0.93, -0.89, -0.9, -0.5, 3.0, -0.9, -0.91])
    loose = Spot(q=1e-4, level=0.8).fit(calm)
    bounded = Spot(q=1e-4, level=0.8, ceiling=10.0).fit(calm)
    assert loose.threshold > 1e6  # the unbounded fit: a fault scoring 40 is "healthy"...
    assert loose.step(40.0) is False
    assert bounded.threshold <= 10.0
    assert bounded.step(40.0) is True  # ...and with the ceiling it alarms
    assert bounded.threshold <= 10.0
    restored = Spot.from_dict(bounded.to_dict())
    assert restored.ceiling == 10.0 and restored.threshold == pytest.approx(bounded.threshold)


@pytest.mark.parametrize("n", [12, 400, 2000])
def test_monitor_spot_keeps_thresholds_between_floor_and_ceiling_whatever_the_calibration_length(n: int) -> None:
    from sluice.health.monitor import CEILING_SPREADS, MIN_SPREAD_NATS, _spot

    rng = np.random.default_rng(4)
    for _ in range(20):
        cal = np.concatenate([rng.normal(-1.0, 3.0, n), rng.pareto(0.3, max(2, n // 50))])
        spot = _spot(1e-3, cal)
        top, mid = float(cal.max()), float(np.median(cal))
        spread = max(top - mid, MIN_SPREAD_NATS)
        assert top + spread - 1e-9 <= spot.threshold <= top + CEILING_SPREADS * spread + 1e-9


def test_monitor_spot_threshold_cannot_run_away_on_a_fault_it_would_have_learned() -> None:
    """The seed-3 campaign's miss: a long calibration with a few high healthy scores let SPOT
    extrapolate a threshold above a fault's scores; streaming SPOT then learned the fault's
    scores as peaks and the threshold climbed without end. Bounded on every calibration, the
    fault's scores are alarms from the first, and alarms are never learned."""
    from sluice.health.monitor import _spot

    rng = np.random.default_rng(7)
    cal = np.concatenate([rng.normal(-7.0, 0.5, 400), [12.0, 20.0, 25.0, 31.0, 39.0]])
    unbounded = Spot(q=1e-3, level=0.98).fit(cal)
    spot = _spot(1e-3, cal)
    fault = rng.uniform(1000.0, 5000.0, 90)
    assert unbounded.threshold > 1000.0  # the GPD extrapolation: a fault scoring 1,000 is "healthy"
    assert all(spot.step(float(x)) for x in fault)
    assert spot.threshold < 1000.0


def test_monitor_spot_idle_node_threshold_tolerates_tiny_deviations() -> None:
    """A node idle during learning scores every window alike; a threshold a hundredth of a
    nat over them would alarm on a 0.3 % I/O stall."""
    from sluice.health.monitor import MIN_SPREAD_NATS, _spot

    cal = -9.06 + np.random.default_rng(1).normal(0.0, 0.005, 90)
    spot = _spot(1e-3, cal)
    assert spot.threshold >= cal.max() + MIN_SPREAD_NATS - 1e-9
    assert spot.step(-8.5) is False
    assert spot.step(600.0) is True


def test_drift_aware_spot_follows_a_drifting_level_and_still_flags_jumps() -> None:
    """Healthy scores that drift upwards after calibration: a fixed SPOT threshold ends up
    crossed by healthy scores all the time, DSPOT (judging the excess over the recent level)
    does not; a jump above the recent level is flagged by both."""
    from sluice.health.metrics import f1_of
    from sluice.health.spot import dspot_alarms

    rng = np.random.default_rng(0)
    calibration = rng.normal(0.0, 1.0, 2000)
    drift = np.linspace(0.0, 8.0, 3000) + rng.normal(0.0, 1.0, 3000)
    scores = drift.copy()
    labels = np.zeros(3000, dtype=np.int8)
    scores[2500:2520] += 15.0
    labels[2500:2520] = 1
    alarms = dspot_alarms(calibration, scores, q=1e-3, depth=20)
    fixed = scores >= Spot(q=1e-3).fit(calibration).threshold
    assert alarms[2500:2520].mean() >= 0.9, "the jump is flagged"
    assert alarms[labels == 0].mean() < 0.01, "the drift is not"
    assert fixed[labels == 0].mean() > 0.2, "a fixed threshold is crossed by the drift"
    assert f1_of(alarms, labels) > 0.8 > f1_of(fixed, labels)


@pytest.mark.parametrize(("shape", "scale"), [(0.3, 1.5), (-0.2, 2.0)])
def test_gpd_fit_agrees_with_scipys_maximum_likelihood(shape: float, scale: float) -> None:
    """The one-variable profile fit lands where scipy's generic MLE does (same tail, same
    threshold), heavy tail or bounded."""
    import warnings

    from scipy import stats

    y = stats.genpareto.rvs(shape, scale=scale, size=400, random_state=np.random.default_rng(5))
    gamma, sigma = fit_gpd(y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_c, _, ref_s = stats.genpareto.fit(y, floc=0.0)
    assert gamma == pytest.approx(ref_c, abs=0.01)
    assert sigma == pytest.approx(ref_s, rel=0.01)


def test_hold_keeps_an_alarm_until_the_score_falls_back() -> None:
    from sluice.health.spot import hysteresis

    scores = np.array([0, 5, 3, 3, 0, 3, 5, 0], dtype=float)
    raised = scores > 4
    held = hysteresis(raised, scores, lower=2.0)
    # Steps 2-3 stay alarmed (3 > 2 right after an alarm); step 5 does not (no alarm before it).
    assert held.tolist() == [False, True, True, True, False, False, True, False]


def test_dspot_follows_slow_drift_that_fixed_spot_alarms_on_and_still_flags_a_jump() -> None:
    from sluice.health.spot import DSpot

    rng = np.random.default_rng(7)
    calibration = rng.normal(size=1000)
    drift = np.linspace(0.0, 20.0, 2000) + rng.normal(size=2000)  # a healthy level creeping up
    fixed = Spot(q=1e-3).fit(calibration)
    aware = DSpot(Spot(q=1e-3), depth=100).fit(calibration)
    fixed_alarms = sum(fixed.step(float(x)) for x in drift)
    aware_alarms = sum(aware.step(float(x)) for x in drift)
    assert fixed_alarms > 1000  # the fixed threshold is crossed for most of the drift
    assert aware_alarms < 0.05 * len(drift)  # 42 here: the level lags a 0.01/step drift by ~0.5
    level = aware.level
    jump = level + 30.0 + rng.normal(size=50)  # a fault: a jump over the recent level
    assert all(aware.step(float(x)) for x in jump)
    assert aware.level == level  # alarms never move the level, so a long fault stays flagged


def test_dspot_round_trips_and_matches_the_batch_form() -> None:
    from sluice.health.spot import DSpot, dspot_alarms

    rng = np.random.default_rng(8)
    cal, test = rng.normal(size=600), np.r_[rng.normal(size=300), rng.normal(size=20) + 15, [np.nan]]
    d = DSpot(Spot(q=1e-3), depth=50).fit(cal)
    for x in test[:150]:
        d.step(float(x))
    restored = DSpot.from_dict(d.to_dict())
    # (the restored GPD is refitted with today's sample count, as `Spot.from_dict` does)
    assert restored.level == pytest.approx(d.level) and restored.threshold == pytest.approx(d.threshold, rel=1e-2)
    assert [restored.step(float(x)) for x in test[150:]] == [d.step(float(x)) for x in test[150:]]
    batch = dspot_alarms(cal, test, q=1e-3, depth=50)
    assert batch[-1] == False  # noqa: E712  (a non-finite score is skipped, not an alarm)
    assert batch[300:320].all() and batch[:300].sum() < 10


def test_monitor_dspot_bounds_the_excess_threshold_and_short_calibrations_fall_back() -> None:
    from sluice.health.monitor import CEILING_SPREADS, MIN_SPREAD_NATS, MonitorConfig, make_threshold
    from sluice.health.spot import DSpot

    rng = np.random.default_rng(9)
    cal = rng.normal(size=400) - 8.0
    th = make_threshold(MonitorConfig(threshold="dspot", dspot_depth=100), cal)
    assert isinstance(th, DSpot) and th.depth == 100
    ex, _ = DSpot.excesses(cal, 100)
    top, spread = float(ex.max()), max(float(ex.max() - np.median(ex)), MIN_SPREAD_NATS)
    assert top + spread - 1e-9 <= th.spot.threshold <= top + CEILING_SPREADS * spread + 1e-9
    assert th.threshold == pytest.approx(th.level + th.spot.threshold)
    few = make_threshold(MonitorConfig(threshold="dspot"), cal[:15])
    assert isinstance(few, Spot)  # too few scores for a level: the bounded SPOT
    assert isinstance(make_threshold(MonitorConfig(threshold="spot"), cal), Spot)
    with pytest.raises(ValueError, match="threshold: 'zscore'"):
        make_threshold(MonitorConfig(threshold="zscore"), cal)
