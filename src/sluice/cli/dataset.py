"""`sluice dataset ...`: Datasets cached next to the jobs that read them."""

from __future__ import annotations

import typer

app = typer.Typer(help="Datasets cached next to the jobs that read them.", no_args_is_help=True)
