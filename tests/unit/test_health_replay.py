"""`sluice bench health --replay`: a recorded campaign trace fed through a fresh monitor.
The trace here is synthetic (two nodes, one CPU fault) in the format the campaign writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sluice.bench.health_replay import replay, result_path
from sluice.cli.main import app
from sluice.health.detector import DetectorConfig
from sluice.health.monitor import MonitorConfig
from sluice.health.state import HealthRules

FAULT = (300, 360)
"""Seconds of the trace during which node-1 carries a CPU hog."""


def kpis(rng: np.random.Generator, t: int, hog: bool) -> dict[str, float]:
    return {
        "node_cpu_other_pct": round(float(abs(rng.normal(0, 0.3)) + (95.0 if hog else 0.0)), 2),
        "node_psi_io_pct": round(float(abs(rng.normal(1.0, 0.3)) + 0.5 * np.sin(t / 9)), 2),
        "node_psi_memory_pct": round(float(abs(rng.normal(0, 0.2))), 2),
    }


def write_trace(folder: Path, grace: dict[int, float] | None = None, length: int = 420) -> Path:
    rng = np.random.default_rng(3)
    trace = folder / "camp.trace.jsonl"
    with trace.open("w") as f:
        for t in range(length):
            fault = 1 if FAULT[0] <= t < FAULT[1] else None
            row: dict[str, object] = {"t": float(t), "fault": fault}
            for node in ("node-0", "node-1"):
                st: dict[str, object] = {
                    "health": "Healthy",
                    "kpis": kpis(rng, t, fault is not None and node == "node-1"),
                }
                if grace is not None:
                    st["grace_s"] = grace.get(t, 0.0) if node == "node-1" else 0.0
                row[node] = st
            f.write(json.dumps(row) + "\n")
    (folder / "camp.json").write_text(
        json.dumps({"faults": [{"n": 1, "kind": "cpu", "node": "node-1", "cordon_after_s": 12.0}]})
    )
    return trace


def quick() -> MonitorConfig:
    return MonitorConfig(
        train_samples=150,
        retrain_growth=0,
        rules=HealthRules(cordon_alarms=3, cordon_window_s=10, clear_s=10, readmit_s=30),
        detector=DetectorConfig(
            history=4, target=1, hidden=16, transforms=2, epochs=10, max_train_s=20, smooth=1, threads=1
        ),
    )


def test_replay_cordons_the_faulted_node_only_and_reports_the_live_delay(tmp_path: Path) -> None:
    trace = write_trace(tmp_path)
    assert result_path(trace) == tmp_path / "camp.json"
    r = replay(trace, config=quick())
    (f,) = r.faults
    assert (f.n, f.node, f.kind, f.live_cordon_after_s) == (1, "node-1", "cpu", 12.0)
    assert f.cordon_after_s is not None and f.cordon_after_s <= 10
    assert r.false_cordons == [] and r.caught == 1 and not r.graced


def test_replay_holds_alarms_under_the_recorded_grace(tmp_path: Path) -> None:
    """The live monitor was under a scheduling change's grace for the fault's first 40 s:
    the replay holds the alarms too, so the cordon comes after the grace, not before."""
    grace = {t: float(FAULT[0] + 40 - t) for t in range(FAULT[0], FAULT[0] + 40)}
    r = replay(write_trace(tmp_path, grace), config=quick())
    (f,) = r.faults
    assert r.graced
    assert f.cordon_after_s is not None and 40 <= f.cordon_after_s <= 50


def test_replay_cli_prints_the_table_and_refuses_what_is_not_a_trace(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = tmp_path / "bad.trace.jsonl"
    bad.write_text("not json\n")
    res = runner.invoke(app, ["bench", "health", "--replay", str(bad)])
    assert res.exit_code == 2 and "--replay" in res.output and "not a campaign trace" in res.output
    res = runner.invoke(app, ["bench", "health", "--replay", str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2
    res = runner.invoke(app, ["bench", "health", "--replay", str(bad), "--campaign"])
    assert res.exit_code == 2 and "not with --campaign" in res.output


def test_replay_compares_threshold_rules_and_counts_alarms_on_healthy_nodes(tmp_path: Path) -> None:
    trace = write_trace(tmp_path)
    spot = replay(trace, config=quick(), threshold="spot")
    aware = replay(trace, config=quick(), threshold="dspot")
    for r in (spot, aware):
        assert r.caught == 1 and r.false_cordons == []
        assert set(r.false_alarms) <= {"node-0", "node-1"}
    assert not spot.drift_aware and aware.drift_aware
    runner = CliRunner()
    res = runner.invoke(app, ["bench", "health", "--threshold", "spot"])
    assert res.exit_code == 2 and "only used with --replay" in res.output
    res = runner.invoke(app, ["bench", "health", "--replay", str(trace), "--threshold", "zscore"])
    assert res.exit_code == 2 and "'zscore' is not 'spot' or 'dspot'" in res.output


def test_health_threshold_setting_is_validated() -> None:
    import pytest
    from pydantic import ValidationError

    from sluice.settings import Settings

    with pytest.raises(ValidationError, match="health_threshold"):
        Settings(health_threshold="zscore")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="health_dspot_depth"):
        Settings(health_dspot_depth=0)
    assert Settings().health_threshold == "dspot"


def test_replay_judges_with_the_window_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--window-steps replaces the node models' modelled window (the live 1, the offline 4):
    the replayed monitor is built with it and still catches the hog. (Whether it cordons
    healthy nodes more is what the option is for: on campaign 17 it did, docs/benchmarks.md.)"""
    import sluice.bench.health_replay as health_replay

    built: list[MonitorConfig] = []
    real = health_replay.HealthMonitor

    def spy(cfg: MonitorConfig) -> object:
        built.append(cfg)
        return real(cfg)

    monkeypatch.setattr(health_replay, "HealthMonitor", spy)
    trace = write_trace(tmp_path)
    r = replay(trace, config=quick(), window_steps=4)
    assert [c.detector.target for c in built] == [4]
    assert r.caught == 1
    runner = CliRunner()
    res = runner.invoke(app, ["bench", "health", "--window-steps", "4"])
    assert res.exit_code == 2 and "--window-steps: only used with --replay" in res.output
    for bad in ("0", "17"):
        res = runner.invoke(app, ["bench", "health", "--replay", str(trace), "--window-steps", bad])
        assert res.exit_code == 2, res.output
