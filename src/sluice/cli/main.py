"""The `sluice` command: noun-verb sub-commands, each in its own module."""

from __future__ import annotations

import typer

from sluice.cli import bench, dataset, health, job, node, sim, tenant, up
from sluice.cli.demo import demo

app = typer.Typer(
    help="sluice: a progress-aware deep-learning training platform.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(job.app, name="job")
app.add_typer(node.app, name="node")
app.add_typer(tenant.app, name="tenant")
app.add_typer(dataset.app, name="dataset")
app.add_typer(sim.app, name="sim")
app.add_typer(bench.app, name="bench")
app.add_typer(health.app, name="health")
app.command("demo")(demo)
app.command("up")(up.up)
app.command("down")(up.down)
