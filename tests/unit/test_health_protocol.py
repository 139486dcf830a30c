"""Leave-servers-out: a setting is chosen only on the other folds' servers, and raw scores
are cached so the grid never retrains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sluice.health.evaluation import Entity
from sluice.health.protocol import (
    RawScores,
    ScoreCache,
    Setting,
    apply,
    choose,
    folds,
    grid,
    leave_servers_out,
)


def _server(name: str, fault_height: float, seed: int) -> RawScores:
    """Per-step baseline scores: healthy N(0,1), one fault segment `fault_height` above."""
    rng = np.random.default_rng(seed)
    test = rng.normal(size=600)
    label = np.zeros(600, dtype=np.int8)
    label[300:340] = 1
    test[300:340] += fault_height
    return RawScores(name, "pca", rng.normal(size=2000), test, label, 0.0)


def test_folds_partition_the_servers_in_order() -> None:
    names = [f"s{i}" for i in range(1, 8)]
    parts = folds(names, 3)
    assert [n for p in parts for n in p] == names
    assert [len(p) for p in parts] == [3, 2, 2]
    with pytest.raises(ValueError, match="folds"):
        folds(names, 1)


def test_the_held_out_servers_never_choose_their_own_setting() -> None:
    """Servers a,b have faults only a low threshold finds; c's fault is huge and its best
    setting is a high threshold. c's fold must get the setting a,b prefer, and a,b's folds
    (choosing on a mix with c) report only their own numbers."""
    raws = {"pca": {"a": _server("a", 2.5, 1), "b": _server("b", 2.5, 2), "c": _server("c", 40.0, 3)}}
    low, high = Setting(method="spot", q=0.05, level=0.95), Setting(method="spot", q=1e-6, level=0.999)
    res = leave_servers_out(raws, {"pca": [high, low]}, k=3)
    by_fold = {r.held_out[0]: r for r in res}
    assert set(by_fold) == {"a", "b", "c"}
    assert by_fold["c"].setting == low  # chosen on a and b
    assert list(by_fold["c"].per_server) == ["c"]
    # On its own, c would have done better with the high threshold: the protocol did not peek.
    assert apply(raws["pca"]["c"], high).f1_auto > by_fold["c"].per_server["c"].f1_auto
    assert choose({s: {"c": apply(raws["pca"]["c"], s)} for s in (high, low)}, ["c"])[0] == high


def test_a_server_without_faults_has_no_f1_but_an_alarm_rate() -> None:
    calm = _server("calm", 0.0, 4)
    calm.label[:] = 0
    out = apply(calm, Setting(method="spot", q=0.05, level=0.9))
    assert np.isnan(out.f1_auto) and np.isnan(out.f1_best) and out.alarm_rate > 0


def test_score_knobs_need_no_retraining_and_the_cache_is_reused(tmp_path: Path) -> None:
    src = tmp_path / "x.npz"
    src.write_bytes(b"data")
    ent = Entity("x", np.zeros((5, 2), np.float32), np.zeros((5, 2), np.float32), np.zeros(5, np.int8))
    calls = []

    def compute() -> tuple[np.ndarray, np.ndarray, float]:
        calls.append(1)
        return np.arange(50, dtype=np.float32), np.arange(5, dtype=np.float32), 1.5

    cache = ScoreCache(tmp_path / "cache")
    first = cache.get_or_compute(ent, src, "sluice-flow", {"epochs": 3}, compute)
    again = cache.get_or_compute(ent, src, "sluice-flow", {"epochs": 3}, compute)
    assert len(calls) == 1 and np.array_equal(first.test, again.test) and again.train_s == 1.5
    cache.get_or_compute(ent, src, "sluice-flow", {"epochs": 4}, compute)  # another model: retrain
    assert len(calls) == 2
    src.write_bytes(b"changed data")  # another file: retrain
    cache.get_or_compute(ent, src, "sluice-flow", {"epochs": 3}, compute)
    assert len(calls) == 3


def test_the_grid_varies_depth_only_for_dspot() -> None:
    g = grid()
    assert len(g) == len(set(g))
    assert {s.depth for s in g if s.method != "dspot"} == {10}
    assert {s.depth for s in g if s.method == "dspot"} == {10, 100}
