"""`sluice sim run --workload cpu:N` with a flag that only shapes a workload CSV (--max-jobs,
--load-factor, --window-start-h, --window-hours): refused naming the flag, before anything runs.
They were silently ignored (`--max-jobs 1` ran all N jobs). And --out/--cdf into a missing
folder are refused before the run, not with a FileNotFoundError after it (walk5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sluice.cli.main import app

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def started(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the simulation started despite bad input")

    import sluice.control.simulate as simulate

    monkeypatch.setattr(simulate, "run_simulation", started)


def refused(args: list[str], where: str) -> str:
    r = CliRunner().invoke(app, ["sim", "run", *args])
    said = f"exit {r.exit_code}\n{r.output[-2000:]}"
    assert r.exit_code == 2, said
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {where}"), said
    return lines[0]


@pytest.mark.parametrize(
    "flag",
    [["--max-jobs", "1"], ["--load-factor", "2"], ["--window-start-h", "1"], ["--window-hours", "1"]],
)
def test_trace_only_flags_are_refused_with_cpu_workload(flag: list[str]) -> None:
    line = refused(["--workload", "cpu:3", "--nodes", "1", *flag], flag[0])
    assert "cpu:3" in line


@pytest.mark.parametrize("flag,name", [("--out", "r.csv"), ("--cdf", "c.png")])
def test_output_in_a_missing_folder_is_refused_before_the_run(tmp_path: Path, flag: str, name: str) -> None:
    line = refused(["--workload", "cpu:3", "--nodes", "1", flag, str(tmp_path / "nodir" / name)], flag)
    assert "no folder" in line
