"""`sluice sim profile` runs a real example on the local engine at two CPU limits (real kernel
quotas) and saves a profile the simulator can load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluice.cli.main import app
from sluice.sim.cpu_profiles import load_curve

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mlp.yaml"


@pytest.mark.integration
@pytest.mark.serial  # measures throughput: the machine's load would be in it
@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/mlp.yaml not in this checkout")
def test_profile_measures_throughput_per_cpu_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    out = tmp_path / "mlp.profile.json"
    r = CliRunner().invoke(
        app, ["sim", "profile", str(EXAMPLE), "--cores", "0.5,2", "--seconds", "2", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    curve = load_curve(out)
    saved = json.loads(out.read_text())
    assert saved["limits"] == [0.5, 2.0]
    # The curve is over the cores the job really got (at most its limit; less on a busy machine).
    assert list(curve.cores) == sorted(curve.cores) and 0 < curve.cores[0] <= 0.5 + 0.05
    assert curve.cores[-1] <= 2.0
    assert all(s > 0 for s in curve.steps_per_s)  # each limit's run trained and was measured
    assert saved["total_steps"] == 18_000  # what the job's reports declared
    assert curve.startup_cpu_s is not None  # start-up measured at two shares and fitted
    assert curve.loss_start > curve.loss_floor
