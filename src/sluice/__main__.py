"""`python -m sluice ...`: the `sluice` command, for environments where its script is not on PATH."""

from sluice.cli.main import app

if __name__ == "__main__":  # imported (a test importing every module), it runs nothing
    app()
