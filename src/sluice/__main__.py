"""`python -m sluice ...`: the `sluice` command, for environments where its script is not on PATH."""

from sluice.cli.main import app

app()
