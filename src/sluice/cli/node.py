"""`sluice node ...`: Nodes: list, cordon, uncordon."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from sluice.cli.client import Client
from sluice.cli.output import Output, OutputOpt, console, emit, errors_reported, number, table

app = typer.Typer(help="Nodes: list, cordon, uncordon.", no_args_is_help=True)

NodeName = Annotated[str, typer.Argument(help="Node name (as `sluice node list` shows it).")]


@app.command("list")
def list_(output: OutputOpt = Output.table) -> None:
    """Every node: CPUs, GPUs, health and why, jobs and CPU handed out."""
    with errors_reported(), Client.from_env() as client:
        nodes = client.call("GET", "/v1/nodes")

    def render(rows: list[dict[str, Any]]) -> None:
        table(
            ["NAME", "CPU", "GPU", "HEALTH", "JOBS", "CPU REQ", "CPU LIM", "REASON"],
            [
                [
                    n.get("name"),
                    number(n.get("cpu"), 3),
                    n.get("gpus", 0),
                    n.get("health", ""),
                    n.get("jobs", ""),
                    number(n.get("cpu_requested"), 3),
                    "∞" if n.get("cpu_limits") is None else number(n.get("cpu_limits"), 3),
                    n.get("reason", ""),
                ]
                for n in rows
            ],
        )

    emit(nodes, output, render)


@app.command()
def cordon(
    name: NodeName,
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why (recorded in the node's history).")],
    output: OutputOpt = Output.table,
) -> None:
    """Take a node out of service: nothing new is placed; its jobs move off via checkpoints (admin)."""
    with errors_reported(), Client.from_env(admin=True) as client:
        node = client.call("POST", f"/v1/nodes/{name}/cordon", json={"reason": reason})
    emit(node, output, lambda n: console.print(f"{name}: {n.get('health', 'Cordoned')} — {reason}", markup=False))


@app.command()
def uncordon(name: NodeName, output: OutputOpt = Output.table) -> None:
    """Put a node back in service (admin)."""
    with errors_reported(), Client.from_env(admin=True) as client:
        node = client.call("POST", f"/v1/nodes/{name}/uncordon")
    emit(node, output, lambda n: console.print(f"{name}: {n.get('health', 'Healthy')}", markup=False))
