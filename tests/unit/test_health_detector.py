"""The flow detector on tiny synthetic KPI series: it learns healthy behaviour, scores a
fault higher, names the faulty KPI, survives save/load unchanged, and weights its score
towards the newest window. The model is deliberately small (one module-scoped fit of a few
seconds) — the behaviour under test does not need a big one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sluice.health.detector import DetectorConfig, FlowDetector
from sluice.health.features import Scaler, per_step, windows

KPIS = ["cpu", "mem", "disk", "net"]
SMALL = DetectorConfig(history=6, hidden=16, transforms=2, epochs=8, batch=128, max_train_s=60, threads=1)


def healthy(n: int, seed: int) -> np.ndarray:
    """Four correlated KPIs with a daily-like cycle and noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    base = np.sin(2 * np.pi * t / 50)
    cpu = 0.5 + 0.3 * base + 0.03 * rng.normal(size=n)
    mem = 0.4 + 0.1 * base + 0.02 * rng.normal(size=n)
    disk = 0.2 + 0.05 * rng.normal(size=n)
    net = 0.3 + 0.2 * base + 0.02 * rng.normal(size=n)
    return np.stack([cpu, mem, disk, net], axis=1).astype(np.float32)


@pytest.fixture(scope="module")
def fitted() -> FlowDetector:
    det = FlowDetector(SMALL)
    det.fit(healthy(800, 0), KPIS)
    return det


def test_windows_and_per_step_align_scores_with_time_steps() -> None:
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    ctx, tgt = windows(x, history=3, target=1)
    assert ctx.shape == (7, 3, 2) and tgt.shape == (7, 2)
    assert tgt[0].tolist() == x[3].tolist() and ctx[0, -1].tolist() == x[2].tolist()
    steps = per_step(np.arange(7, dtype=np.float32), 10)
    assert steps.tolist() == [0, 0, 0, 0, 1, 2, 3, 4, 5, 6]
    # A series shorter than one window still gets one score per step.
    ctx, _ = windows(x[:2], history=3, target=1)
    assert len(ctx) == 1


def test_scaler_floors_the_spread_of_constant_kpis() -> None:
    x = np.zeros((100, 2), dtype=np.float32)
    x[:, 1] = np.linspace(0, 1, 100)
    sc = Scaler.fit(x)
    assert sc.scale[0] > 0
    assert np.isfinite(sc.transform(np.ones((1, 2), np.float32))).all()


def test_fault_scores_higher_than_healthy(fitted: FlowDetector) -> None:
    test = healthy(400, 1)
    test[200:240, 2] += 0.6  # disk storm
    s = fitted.score(test)
    assert s.shape == (400,)
    assert np.median(s[205:240]) > np.quantile(np.r_[s[:190], s[250:]], 0.99)
    # Calibration scores come from held-out healthy data and look like healthy test scores.
    assert np.median(fitted.calibration) < np.median(s[205:240])
    assert fitted.report is not None and fitted.report.epochs == SMALL.epochs


def test_attribution_names_the_faulty_kpi(fitted: FlowDetector) -> None:
    test = healthy(100, 2)
    test[-1, 2] += 0.8
    shares = fitted.attribute(test)
    assert set(shares) == set(KPIS)
    assert max(shares, key=lambda k: shares[k]) == "disk"
    assert sum(shares.values()) == pytest.approx(1.0)


def test_save_load_gives_identical_scores(fitted: FlowDetector, tmp_path: Path) -> None:
    path = tmp_path / "node.pt"
    fitted.save(path)
    back = FlowDetector.load(path)
    x = healthy(100, 3)
    assert np.allclose(back.score(x), fitted.score(x), atol=1e-5)
    assert back.kpis == KPIS
    assert back.config == fitted.config
    assert np.allclose(back.calibration, fitted.calibration)


def test_model_saved_before_decay_existed_keeps_equal_weights(fitted: FlowDetector, tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    fitted.save(path)
    blob = torch.load(str(path), weights_only=True)
    meta = json.loads(blob["meta"])
    del meta["config"]["decay"]
    blob["meta"] = json.dumps(meta)
    torch.save(blob, str(path))
    assert FlowDetector.load(path).config.decay == 0.0


def test_smoothing_weights_the_newest_window_by_decay() -> None:
    nll = np.array([0, 0, 0, 0, 0, 0, 10, 10, 10, 0, 0], dtype=np.float32)
    flat = FlowDetector(DetectorConfig(smooth=5, decay=0.0))._smooth(nll)
    # Equal weights: the mean of the newest 5 (fewer at the start).
    assert flat[6] == pytest.approx(2.0) and flat[8] == pytest.approx(6.0) and flat[0] == 0.0
    newest = FlowDetector(DetectorConfig(smooth=5, decay=0.7))._smooth(nll)
    w = 0.7 * 0.3 ** np.arange(5)
    assert newest[6] == pytest.approx(10 * w[0] / w.sum(), rel=1e-5)
    # The first step of a fault shows almost at full height, and fades as fast after it.
    assert newest[6] > 6.5 > flat[6]
    assert newest[10] < flat[10]
    assert np.array_equal(FlowDetector(DetectorConfig(smooth=1))._smooth(nll), nll)


def test_config_rejects_bad_smoothing() -> None:
    with pytest.raises(ValueError, match="decay"):
        DetectorConfig(decay=1.5)
    with pytest.raises(ValueError, match="smooth"):
        DetectorConfig(smooth=0)


def test_unfitted_detector_says_so() -> None:
    with pytest.raises(RuntimeError, match="not fitted"):
        FlowDetector().score(np.zeros((20, 3), np.float32))


def test_scaler_absolute_floor_keeps_tick_jitter_small() -> None:
    # A CPU share that read 0 or 1 % while healthy: without an absolute floor a 3-point
    # wobble is ~6 standard deviations; with a 2-point floor it is 1.5.
    x = np.zeros((60, 1), dtype=np.float32)
    x[::10, 0] = 1.0
    loose = Scaler.fit(x, min_scale=0.1)
    floored = Scaler.fit(x, min_scale=0.1, min_abs=np.array([2.0], np.float32))
    wobble = np.array([[3.0]], np.float32)
    assert float(loose.transform(wobble)[0, 0]) > 5.0
    assert float(floored.transform(wobble)[0, 0]) < 2.0
    assert float(floored.transform(np.array([[98.0]], np.float32))[0, 0]) == floored.clip  # a storm still saturates


@pytest.fixture(scope="module")
def graph_fitted() -> FlowDetector:
    det = FlowDetector(DetectorConfig(**{**SMALL.__dict__, "encoder": "graph", "epochs": 40}))
    det.fit(healthy(800, 0), KPIS)
    return det


def test_graph_encoder_scores_a_broken_relation_between_kpis_higher(graph_fitted: FlowDetector, tmp_path: Path) -> None:
    """net normally follows cpu's cycle; for 40 steps it holds still at its mean, every value
    within its healthy range: only the relation between the two is off."""
    assert graph_fitted.net is not None and graph_fitted.net.graph is not None
    test = healthy(400, 1)
    test[200:240, 3] = 0.3
    s = graph_fitted.score(test)
    assert np.median(s[210:240]) > np.quantile(np.r_[s[:190], s[250:]], 0.99)
    path = tmp_path / "graph.pt"
    graph_fitted.save(path)
    back = FlowDetector.load(path)
    assert back.config.encoder == "graph"
    assert np.allclose(back.score(test), s, atol=1e-5)


def test_config_rejects_an_unknown_encoder() -> None:
    with pytest.raises(ValueError, match="encoder"):
        DetectorConfig(encoder="transformer")
