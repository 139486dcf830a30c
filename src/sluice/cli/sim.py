"""`sluice sim ...`: The simulator: run policies on traces and workloads."""

from __future__ import annotations

import typer

app = typer.Typer(help="The simulator: run policies on traces and workloads.", no_args_is_help=True)
