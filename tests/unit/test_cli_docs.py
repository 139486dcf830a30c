"""docs/cli.md is the CLI's own help, generated (`make cli-docs`): it cannot drift from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_the_command_reference_is_what_the_cli_says_today(tmp_path: Path) -> None:
    out = tmp_path / "cli.md"
    subprocess.run(
        [sys.executable, "-m", "typer", "sluice.cli.main", "utils", "docs", "--name", "sluice",
         "--title", "sluice command reference", "--output", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    assert out.read_text() == DOCS.read_text(), "docs/cli.md is stale: run `make cli-docs`"
