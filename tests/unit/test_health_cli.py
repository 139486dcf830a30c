"""`sluice health eval` on a tiny folder in the ASD format: every contender, per entity and
mean, and clear errors for a bad folder or file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sluice.cli.main import app


def write_entity(folder: Path, name: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    train = rng.normal(0.5, 0.05, size=(300, 3)).astype(np.float32)
    test = rng.normal(0.5, 0.05, size=(200, 3)).astype(np.float32)
    label = np.zeros(200, dtype=np.int8)
    test[120:140, 1] += 0.5
    label[120:140] = 1
    np.savez(folder / f"{name}.npz", train=train, test=test, test_label=label)


def test_eval_prints_every_detector_and_writes_json(tmp_path: Path) -> None:
    for i, name in enumerate(("srv-2", "srv-10")):
        write_entity(tmp_path, name, i)
    out = tmp_path / "rows.json"
    res = CliRunner().invoke(
        app, ["health", "eval", str(tmp_path), "--epochs", "3", "--json", str(out)], env={"COLUMNS": "200"}
    )
    assert res.exit_code == 0, res.output
    for word in ("sluice-flow", "pca", "iforest", "autoencoder", "srv-2", "srv-10", "mean", "inflated"):
        assert word in res.output
    data = json.loads(out.read_text())
    assert [r["entity"] for r in data["rows"]][::4] == ["srv-2", "srv-10"]  # natural order
    flow = data["mean"]["sluice-flow"]
    assert flow["auroc"] > 0.9  # an obvious fault on one KPI is found
    assert flow["windows_per_s"] > 0 and flow["train_s"] > 0


NUMBER = re.compile(r"\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+")


def test_eval_at_80_columns_keeps_every_number(tmp_path: Path) -> None:
    """At 80 columns the one table cut every number to `0.9…`; now it is two tables (point-wise
    F1 and ranking; PA F1 and cost), each number whole, and the JSON is the same as ever."""
    for i, name in enumerate(("srv-2", "srv-10")):
        write_entity(tmp_path, name, i)
    out = tmp_path / "rows.json"
    res = CliRunner().invoke(
        app, ["health", "eval", str(tmp_path), "--epochs", "2", "--json", str(out)], env={"COLUMNS": "80"}
    )
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    data = json.loads(out.read_text())
    assert set(data) == {"rows", "mean"} and len(data["rows"]) == 8
    shown = set(NUMBER.findall(res.output))
    for row in data["rows"]:
        for m in ("f1_best", "f1_spot", "f1_dspot", "f1_pa", "f1_pak", "auroc", "auprc"):
            assert f"{row[m]:.3f}" in shown, (row["entity"], row["detector"], m)
        assert f"{row['windows_per_s']:,.0f}" in shown
    for head in ("F1 best", "F1 DSPOT", "AUPRC", "F1 PA%20", "windows/s", "srv-10", "autoencoder", "mean"):
        assert head in res.output


def test_leave_servers_out_at_80_columns_keeps_every_number(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i, name in enumerate(("srv-1", "srv-2", "srv-3")):
        write_entity(data, name, i)
    args = ["health", "eval", str(data), "--protocol", "leave-servers-out", "--folds", "3", "--epochs", "2"]
    res = CliRunner().invoke(app, [*args, "--no-baselines"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    assert "sluice-flow" in res.output  # a detector's name is not broken across lines


def test_eval_names_the_problem_with_a_bad_folder_or_file(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["health", "eval", str(tmp_path / "nope")], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "not a folder" in res.output
    np.savez(tmp_path / "bad.npz", train=np.zeros((10, 2)), test=np.zeros((5, 2)))
    res = CliRunner().invoke(app, ["health", "eval", str(tmp_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "bad.npz" in res.output and "test_label" in res.output


def answering(monkeypatch: pytest.MonkeyPatch, answers: list[dict[str, object]]) -> None:
    """`sluice node why` talks to a stand-in client (a fake, no server) that gives `answers`
    in turn, the last one again once they run out; a wide terminal."""
    import contextlib
    from collections.abc import Iterator

    import sluice.cli.node as node_cli

    class Client:
        def node_why(self, name: str) -> dict[str, object]:
            return {**(answers.pop(0) if len(answers) > 1 else answers[0]), "node": name}

    @contextlib.contextmanager
    def connect(admin: bool = False) -> Iterator[Client]:
        yield Client()

    monkeypatch.setattr(node_cli, "connect", connect)
    monkeypatch.setenv("COLUMNS", "200")


def test_node_why_prints_each_kpi_against_what_was_healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sluice node why` renders the newest alarm's KPIs (a KPI a loaded model lacks the
    healthy mean of is shown blank, not as an error)."""
    answer = {
        "node": "node-1",
        "health": "Cordoned",
        "reason": "5 anomalies in 20s",
        "monitored": True,
        "score": 961.5,
        "threshold": -8.6,
        "alarms": 12,
        "held": 2,
        "alarm": {
            "time": 0.0,
            "score": 961.5,
            "threshold": -8.6,
            "kpis": [
                {"kpi": "node_cpu_other_pct", "share": 0.97, "value": 97.1, "healthy_mean": 0.0, "healthy_spread": 2.0},
                {"kpi": "node_psi_io_pct", "share": 0.01, "value": 0.3},
            ],
        },
    }

    answering(monkeypatch, [answer])
    r = CliRunner().invoke(app, ["node", "why", "node-1"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("node-1: Cordoned — 5 anomalies in 20s")
    assert "12 alarms counted, 2 held" in r.output
    row = next(line for line in r.output.splitlines() if "node_cpu_other_pct" in line).split()
    assert row == ["node_cpu_other_pct", "97%", "97.1", "0", "2"]
    assert "node_psi_io_pct" in r.output


def test_node_why_says_the_model_is_learning_instead_of_a_blank_score(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    answers = [
        {"health": "Healthy", "monitored": True, "state": "learning", "healthy_samples": 41, "train_samples": 60},
        {"health": "Healthy", "monitored": True, "state": "refitting", "score": -8.9, "threshold": 3.5,
         "scored_at": time.time() - 130, "alarms": 1},
    ]  # fmt: skip

    answering(monkeypatch, answers)
    r = CliRunner().invoke(app, ["node", "why", "node-1"])
    assert r.exit_code == 0, r.output
    assert "learning the node's model: 41/60 healthy samples" in r.output and "threshold" not in r.output
    r = CliRunner().invoke(app, ["node", "why", "node-1"])
    assert "score -8.9 (threshold 3.5) at " in r.output and "(2m ago); a newer model is being fitted" in r.output


def test_leave_servers_out_reports_each_fold_and_caches_scores(tmp_path: Path) -> None:
    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()
    for i, name in enumerate(("srv-1", "srv-2", "srv-3")):
        write_entity(data, name, i)
    out = tmp_path / "lso.json"
    args = ["health", "eval", str(data), "--protocol", "leave-servers-out", "--folds", "3", "--epochs", "2"]
    res = CliRunner().invoke(
        app, [*args, "--no-baselines", "--cache", str(cache), "--json", str(out)], env={"COLUMNS": "250"}
    )
    assert res.exit_code == 0, res.output
    assert "held-out" in res.output and "auto/best" in res.output and "live monitor's rule" in res.output
    data_out = json.loads(out.read_text())
    assert set(data_out["live_rule"]["sluice-flow"]) == {"srv-1", "srv-2", "srv-3"}
    assert [r["held_out"] for r in data_out["results"]] == [["srv-1"], ["srv-2"], ["srv-3"]]
    assert 0 <= data_out["mean"]["sluice-flow"]["f1_auto"] <= 1
    assert len(list(cache.glob("*.npz"))) == 3  # one model per server, whatever the grid
    res = CliRunner().invoke(app, [*args, "--smooth", "3"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "--smooth" in res.output and "chosen per fold" in res.output
    res = CliRunner().invoke(app, ["health", "eval", str(data), "--folds", "2"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "--folds" in res.output


def test_campaign_traces_are_read_by_health_eval(tmp_path: Path) -> None:
    """What `bench health --campaign --record` writes is a folder `health eval` reads: train
    before the first fault, test after, labels only on the faulty node while its fault ran."""
    from sluice.bench.kpi_record import FaultWindow, KpiRecorder
    from sluice.health.evaluation import load_folder

    rec = KpiRecorder()
    keys = ["node_cpu_other_pct", "node_psi_io_pct"]
    for t in range(400):
        for node in ("node-0", "node-1"):
            hot = node == "node-1" and 300 <= t <= 330
            rec.add(node, keys, np.array([90.0 if hot else 1.0, 0.5], np.float32), 1000.0 + t)
    files = rec.write(tmp_path, [FaultWindow("node-1", 1300.0, 30.0)])
    assert [f.name for f in files] == ["node-0.npz", "node-1.npz"]
    ents = {e.name: e for e in load_folder(tmp_path)}
    assert ents["node-1"].train.shape == (300, 2) and ents["node-1"].test.shape == (100, 2)
    assert ents["node-1"].label.sum() == 31 and ents["node-1"].label[:31].all()
    assert ents["node-0"].label.sum() == 0  # a fault next door is not this node's
    with np.load(files[1]) as d:
        assert d["kpis"].tolist() == keys
    assert KpiRecorder().write(tmp_path / "none", []) == []


def test_eval_with_the_graph_encoder_and_a_refused_unknown_one(tmp_path: Path) -> None:
    write_entity(tmp_path, "srv-1", 0)
    out = tmp_path / "rows.json"
    args = ["health", "eval", str(tmp_path), "--epochs", "3", "--no-baselines", "--json", str(out)]
    res = CliRunner().invoke(app, [*args, "--encoder", "graph"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["mean"]["sluice-flow"]["auroc"] > 0.9
    res = CliRunner().invoke(app, [*args, "--encoder", "lstm"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "--encoder" in res.output and "'lstm'" in res.output
    res = CliRunner().invoke(app, [*args, "--seed", "-1"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "--seed" in res.output


def test_node_why_says_no_sample_is_scored_yet_instead_of_a_blank_score(monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after a restart a saved model is loaded but nothing is scored yet: the line read
    `score  (threshold -3.277)` (ops walk s31)."""
    answering(
        monkeypatch,
        [{"health": "Cordoned", "monitored": True, "state": "scoring", "score": None, "threshold": -3.277}],
    )
    r = CliRunner().invoke(app, ["node", "why", "node-1"])
    assert r.exit_code == 0, r.output
    assert "no sample scored yet since the plane started (threshold -3.277)" in r.output
    assert "score  (" not in r.output
