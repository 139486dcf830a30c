"""The flow detector on small synthetic KPI series: it learns healthy behaviour, scores a
fault higher, names the faulty KPI, and survives save/load unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sluice.health.detector import DetectorConfig, FlowDetector
from sluice.health.features import Scaler, per_step, windows

KPIS = ["cpu", "mem", "disk", "net"]


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
    det = FlowDetector(DetectorConfig(history=8, hidden=32, transforms=3, epochs=15, max_train_s=60, threads=1))
    det.fit(healthy(1500, 0), KPIS)
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
    test = healthy(600, 1)
    test[300:340, 2] += 0.6  # disk storm
    s = fitted.score(test)
    assert s.shape == (600,)
    assert np.median(s[305:340]) > np.quantile(np.r_[s[:290], s[350:]], 0.99)
    assert fitted.report is not None and fitted.report.epochs >= 1


def test_attribution_names_the_faulty_kpi(fitted: FlowDetector) -> None:
    test = healthy(200, 2)
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
    assert np.allclose(back.score(x), fitted.score(x), atol=1e-4)
    assert back.kpis == KPIS
    assert np.allclose(back.calibration, fitted.calibration)


def test_unfitted_detector_says_so() -> None:
    with pytest.raises(RuntimeError, match="not fitted"):
        FlowDetector().score(np.zeros((20, 3), np.float32))
