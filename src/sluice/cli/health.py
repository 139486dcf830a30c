"""`sluice health ...`: Node health: anomaly detection models and their offline evaluation."""

from __future__ import annotations

import typer

app = typer.Typer(help="Node health: anomaly detection models and their offline evaluation.", no_args_is_help=True)
