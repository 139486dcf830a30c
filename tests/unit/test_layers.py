"""The design brief's layering rules, enforced by import-linter on every test run."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(LINT.parent), "PYTHONPATH": str(root / "src")}
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_import_contracts_hold() -> None:
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout, proc.stdout


def test_control_may_not_import_the_layers_above_it() -> None:
    """The one arrow that used to point up (the server process inside control) stays out."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    control = [c for c in contracts if c.get("source_modules") == ["sluice.control"]]
    assert control, "no import-linter contract for sluice.control"
    forbidden = set(control[0]["forbidden_modules"])
    assert {"sluice.api", "sluice.cli", "sluice.server"} <= forbidden


def test_a_control_module_importing_the_api_breaks_the_contracts(tmp_path: Path) -> None:
    """The contract bites: the same source with one upward import fails lint-imports."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "src" / "sluice", tmp_path / "src" / "sluice", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "src" / "sluice" / "control" / "upward.py").write_text("import sluice.api.app\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert "control does not import api" in proc.stdout
    assert "sluice.control.upward -> sluice.api.app" in proc.stdout, proc.stdout
