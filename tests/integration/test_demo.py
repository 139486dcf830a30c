"""`sluice demo` as a user runs it (shortened): every job succeeds and the summary is printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_demo_runs_every_job_to_success(tmp_path: Path) -> None:
    sluice = Path(sys.executable).with_name("sluice")
    env = {**os.environ, "SLUICE_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    proc = subprocess.Popen(
        [str(sluice), "demo", "--scale", "0.03", "--stagger", "1", "--interval", "2", "--home", str(tmp_path / "d")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=280)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the demo cancels its jobs before it exits
        out, _ = proc.communicate(timeout=60)
        raise AssertionError("the demo did not finish in time:\n" + out[-3000:]) from None
    assert proc.returncode == 0, out[-3000:]
    assert out.count("Succeeded") >= 6, out[-3000:]
    for name in ("mlp-0", "cnn-1", "lstm-2", "autoencoder-3", "mlp-4", "cnn-5"):
        assert name in out
    assert "average JCT" in out
