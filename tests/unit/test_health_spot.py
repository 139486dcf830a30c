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
