"""`sluice node ...`: Nodes: list, cordon, uncordon."""

from __future__ import annotations

import typer

app = typer.Typer(help="Nodes: list, cordon, uncordon.", no_args_is_help=True)
