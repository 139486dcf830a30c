"""Anomaly metrics: point-wise, point-adjusted and PA%K F1 against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.health.metrics import adjust, best_f1, evaluate_scores, f1_at, segments


def test_segments_finds_runs_of_ones() -> None:
    assert segments(np.array([0, 1, 1, 0, 0, 1, 0, 1, 1, 1])) == [(1, 3), (5, 6), (7, 10)]
    assert segments(np.zeros(4)) == []


def test_point_adjust_credits_a_whole_segment_for_one_hit() -> None:
    y = np.array([0, 0, 1, 1, 1, 1, 0, 0])
    s = np.array([0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0])
    # Point-wise at threshold 0.5: one of four anomalous points found.
    assert f1_at(s, y, 0.5) == pytest.approx(2 * 1 / (1 + 4))
    # Point-adjusted: the segment counts as found, so F1 is perfect.
    assert f1_at(adjust(s, y), y, 0.5) == pytest.approx(1.0)
    # PA%K with K=50: one of four flagged (25 %) is not enough, so no adjustment.
    assert f1_at(adjust(s, y, 50), y, 0.5) == pytest.approx(f1_at(s, y, 0.5))


def test_pak_adjusts_once_k_percent_of_the_segment_is_flagged() -> None:
    y = np.array([1, 1, 1, 1, 1, 0])
    s = np.array([0.9, 0.8, 0.1, 0.1, 0.1, 0.0])
    adj = adjust(s, y, 40)  # ceil(0.4*5)=2 points needed; the 2nd largest is 0.8
    assert adj[:5].tolist() == pytest.approx([0.9, 0.8, 0.8, 0.8, 0.8])
    assert adj[5] == 0.0


def test_best_f1_finds_the_separating_threshold() -> None:
    y = np.array([0, 0, 0, 1, 1])
    s = np.array([0.1, 0.2, 0.3, 0.8, 0.9])
    f, t = best_f1(s, y)
    assert f == pytest.approx(1.0)
    assert 0.3 < t <= 0.8


def test_random_scores_get_high_pa_f1_but_low_pointwise_f1() -> None:
    """Why PA is reported beside the others: on long segments, noise looks like a detector."""
    rng = np.random.default_rng(0)
    y = np.zeros(2000, dtype=int)
    for a in range(100, 2000, 400):
        y[a : a + 150] = 1
    sc = evaluate_scores(rng.random(2000), y, spot_threshold=0.99)
    assert sc.f1_pa > 0.8
    assert sc.f1_best < 0.6
    assert 0.4 < sc.auroc < 0.6


def test_a_node_without_anomalies_has_no_f1_at_any_threshold_and_leaves_the_means_alone() -> None:
    """A campaign node no fault ran on: its automatic thresholds' F1 is undefined (NaN) like
    its best F1, so the means (and the automatic/best ratio) are over the faulty nodes only;
    a 0 there used to halve the ratio on a two-node recording."""
    from sluice.health.evaluation import EvaluationRow, average

    calm = evaluate_scores(np.arange(100.0), np.zeros(100, dtype=int), 50.0, alarms=np.arange(100) > 50)
    assert np.isnan(calm.f1_spot) and np.isnan(calm.f1_dspot) and np.isnan(calm.f1_best)
    y = np.zeros(100, dtype=int)
    y[90:] = 1
    faulty = evaluate_scores(np.arange(100.0), y, 89.5, alarms=np.arange(100) >= 90)
    assert faulty.f1_spot == pytest.approx(1.0) and faulty.f1_dspot == pytest.approx(1.0)
    rows = [EvaluationRow("a", "flow", faulty, 1.0, 1.0), EvaluationRow("b", "flow", calm, 1.0, 1.0)]
    assert average(rows)["flow"]["f1_spot"] == pytest.approx(1.0)
