"""`sluice tenant ...`: Tenants and their API tokens (admin)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from sluice.cli.client import EXIT_USAGE, Client, CliError
from sluice.cli.output import Output, OutputOpt, console, emit, errors_reported, table, when
from sluice.spec import SpecError, TenantSpec
from sluice.spec.loading import parse_model

app = typer.Typer(help="Tenants and their API tokens (admin).", no_args_is_help=True)


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="Lower-case name: letters, digits, '-', '.', '_'.")],
    admin: Annotated[bool, typer.Option("--admin", help="May manage tenants and nodes and see every job.")] = False,
    max_running_jobs: Annotated[int | None, typer.Option(help="Quota: jobs running at once.")] = None,
    weight: Annotated[float, typer.Option(help="Fair-share weight.")] = 1.0,
    output: OutputOpt = Output.table,
) -> None:
    """Create a tenant and print its token — shown this once; sluice keeps only a hash."""
    with errors_reported():
        fields: dict[str, Any] = {"name": name, "admin": admin, "weight": weight}
        if max_running_jobs is not None:
            fields["max_running_jobs"] = max_running_jobs
        try:
            spec = parse_model(TenantSpec, fields)
        except SpecError as err:
            raise CliError("invalid tenant", EXIT_USAGE, [p.__dict__ for p in err.problems]) from None
        with Client.from_env(admin=True) as client:
            created = client.call("POST", "/v1/tenants", json=spec.model_dump(mode="json"))

    def render(t: dict[str, Any]) -> None:
        console.print(f"created tenant {t['name']}; its token (shown once, keep it safe):", markup=False)
        typer.echo(t["token"])

    emit(created, output, render)


@app.command("list")
def list_(output: OutputOpt = Output.table) -> None:
    """Every tenant with its role and quota (never tokens)."""
    with errors_reported(), Client.from_env(admin=True) as client:
        tenants = client.call("GET", "/v1/tenants")

    def render(rows: list[dict[str, Any]]) -> None:
        table(
            ["NAME", "ADMIN", "MAX RUNNING", "WEIGHT", "CREATED"],
            [
                [
                    t["name"],
                    "yes" if t["admin"] else "",
                    t["max_running_jobs"] or "",
                    t["weight"],
                    when(t["created_at"]),
                ]
                for t in rows
            ],
        )

    emit(tenants, output, render)


@app.command()
def delete(
    name: Annotated[str, typer.Argument(help="The tenant to delete (it must have no unfinished jobs).")],
) -> None:
    """Delete a tenant; its token stops working at once."""
    with errors_reported(), Client.from_env(admin=True) as client:
        client.call("DELETE", f"/v1/tenants/{name}")
    console.print(f"deleted tenant {name}", markup=False)
