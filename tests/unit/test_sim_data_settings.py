"""The simulator on a fresh clone: GPU jobs run on the job models shipped in the package, and
data that is not shipped (the Pollux workloads, the Philly trace) is asked for by its setting,
in one line with exit code 2, never with a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluice.cli.main import app
from sluice.sim.apps import SHIPPED_MODELS

runner = CliRunner()
APPS = {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}


@pytest.fixture
def fresh_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Settings as on a clean CI clone: an empty Pollux data folder, no models override."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLUICE_POLLUX_DATA", str(empty))
    monkeypatch.delenv("SLUICE_POLLUX_TRACES", raising=False)
    return empty


def test_the_package_ships_the_six_job_models_with_their_source_and_licence() -> None:
    assert {p.name for p in SHIPPED_MODELS.iterdir() if (p / "placements.csv").is_file()} == APPS
    for name in APPS:
        assert (SHIPPED_MODELS / name / "scalability.csv").is_file()
        assert list((SHIPPED_MODELS / name).glob("validation-*.csv"))
    source = (SHIPPED_MODELS / "SOURCE.md").read_text()
    assert "petuum/adaptdl" in source and "Apache" in source
    assert not list(SHIPPED_MODELS.rglob("philly*")) and not list(SHIPPED_MODELS.rglob("workload*"))
    assert sum(f.stat().st_size for f in SHIPPED_MODELS.rglob("*") if f.is_file()) < 2_000_000


def test_a_small_gpu_workload_runs_on_the_shipped_models(fresh_clone: Path, tmp_path: Path) -> None:
    wl = tmp_path / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\na,0,ncf,1,256\nb,60,ncf,2,512\n")
    r = runner.invoke(app, ["sim", "run", "--workload", str(wl), "--nodes", "1", "--policy", "fifo", "-o", "json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["finished"] == 2 and summary["jobs"] == 2


def test_a_models_override_without_models_names_its_setting(fresh_clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wl = fresh_clone.parent / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\na,0,ncf,1,256\n")
    monkeypatch.setenv("SLUICE_POLLUX_TRACES", str(fresh_clone))
    r = runner.invoke(app, ["sim", "run", "--workload", str(wl), "--nodes", "1"])
    assert r.exit_code == 2
    assert "SLUICE_POLLUX_TRACES" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "sim", "--parts", "pollux", "--loads", "1.0", "--workloads", "1"],
        ["bench", "sim", "--parts", "scale"],
        ["bench", "fairness"],
    ],
)
def test_missing_pollux_data_is_a_one_line_error_naming_the_setting(fresh_clone: Path, args: list[str]) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "SLUICE_POLLUX_DATA" in r.output and "workloads/" in r.output and "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
