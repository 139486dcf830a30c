"""`sluice bench ...`: Benchmarks that run contenders side by side and print ratios."""

from __future__ import annotations

import typer

app = typer.Typer(help="Benchmarks that run contenders side by side and print ratios.", no_args_is_help=True)
