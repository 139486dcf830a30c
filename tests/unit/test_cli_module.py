"""The CLI runs as a module too: `python -m sluice` and `python -m sluice.cli.main`."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["sluice", "sluice.cli.main"])
def test_the_cli_runs_as_a_module(module: str) -> None:
    """`python -m sluice.cli.main --help` printed nothing and exited 0: the module defined the
    app and never ran it."""
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Usage" in out.stdout and "job" in out.stdout, out
