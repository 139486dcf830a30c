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


def test_monitor_spot_keeps_short_calibration_thresholds_between_floor_and_ceiling() -> None:
    from sluice.health.monitor import CEILING_SPREADS, _spot

    rng = np.random.default_rng(4)
    for _ in range(50):
        cal = np.concatenate([rng.normal(-1.0, 0.05, 12), rng.pareto(0.3, 2)])
        spot = _spot(1e-4, cal)
        top, mid = float(cal.max()), float(np.median(cal))
        assert top + (top - mid) - 1e-9 <= spot.threshold <= top + CEILING_SPREADS * (top - mid) + 1e-9


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
