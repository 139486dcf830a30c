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


def test_no_help_text_is_eaten_as_markup() -> None:
    """The CLI renders help with rich, which takes `[word]` for a style tag and drops it:
    `--replica`'s help read "prefixes each replica's lines with )." for `[rankK]`. Every
    bracket in a help text that rich would read as a tag must be escaped (`\\[`)."""
    import re

    import typer.main

    from sluice.cli.main import app

    tag = re.compile(r"(?<!\\)\[[a-z#/@]")  # rich's markup tags start so (case-sensitive)
    eaten = []

    def walk(command: object, path: str) -> None:
        for param in getattr(command, "params", []):
            if tag.search(getattr(param, "help", None) or ""):
                eaten.append(f"{path} {param.name}: {param.help}")
        for text in (getattr(command, "help", None) or "", getattr(command, "short_help", None) or ""):
            if tag.search(text):
                eaten.append(f"{path}: {text[:80]}")
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "sluice")
    assert eaten == []
