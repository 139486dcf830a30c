"""`sluice health eval` on a tiny folder in the ASD format: every contender, per entity and
mean, and clear errors for a bad folder or file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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


def test_eval_names_the_problem_with_a_bad_folder_or_file(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["health", "eval", str(tmp_path / "nope")], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "not a folder" in res.output
    np.savez(tmp_path / "bad.npz", train=np.zeros((10, 2)), test=np.zeros((5, 2)))
    res = CliRunner().invoke(app, ["health", "eval", str(tmp_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "bad.npz" in res.output and "test_label" in res.output
