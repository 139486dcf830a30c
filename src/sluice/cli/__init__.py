"""The typer CLI, thin over the REST API and control."""
