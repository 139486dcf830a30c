"""`sluice tenant ...`: Tenants and their API tokens (admin)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Tenants and their API tokens (admin).", no_args_is_help=True)
