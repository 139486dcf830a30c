"""`sluice job ...`: Submit, list, follow, cancel and explain training jobs."""

from __future__ import annotations

import typer

app = typer.Typer(help="Submit, list, follow, cancel and explain training jobs.", no_args_is_help=True)
