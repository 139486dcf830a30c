"""`sluice tenant ...`: Tenants and their API tokens (admin)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from sluice.cli.client import EXIT_USAGE, CliError, connect
from sluice.cli.output import Output, OutputOpt, console, emit, errors_reported, table, when
from sluice.spec import SpecError, TenantPatch, TenantSpec
from sluice.spec.loading import parse_model

app = typer.Typer(help="Tenants and their API tokens (admin).", no_args_is_help=True)


def _cap(value: str) -> int | None:
    """--max-priority's value: an integer, or None (no cap) for 'none'."""
    if value.strip().lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise CliError(f"--max-priority: {value!r} is not an integer or 'none'", EXIT_USAGE) from None


def _shown_cap(t: dict[str, Any]) -> str:
    return "no cap" if t.get("max_priority") is None else str(t["max_priority"])


def _shown_disk(t: dict[str, Any]) -> str:
    return "no cap" if not t.get("max_disk_mb") else f"{t['max_disk_mb']} MiB"


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="Lower-case name: letters, digits, '-', '.', '_'.")],
    admin: Annotated[bool, typer.Option("--admin", help="May manage tenants and nodes and see every job.")] = False,
    max_running_jobs: Annotated[
        int | None, typer.Option(help="Quota: jobs admitted at once (0 or unset: no limit, as with `tenant set`).")
    ] = None,
    weight: Annotated[float, typer.Option(help="Fair-share weight, 0.001 to 1000.")] = 1.0,
    max_priority: Annotated[
        int | None,
        typer.Option(
            help="The highest priority its jobs may have (-1000..1000; bare priority or a class's value), checked "
            "at submit and resume. Default: no cap, so its jobs may preempt other tenants' lower-priority jobs in a "
            "shared queue."
        ),
    ] = None,
    max_disk_mb: Annotated[
        int | None,
        typer.Option(
            help="MiB its jobs' run folders may hold on disk, ended jobs' included, before its pending jobs wait "
            "(0 or unset: no cap)."
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Create it although tenant isolation is off (`sluice up` says so): its jobs and every other "
            "tenant's can then read each other's data.",
        ),
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Create a tenant and print its token — shown this once; sluice keeps only a hash."""
    with errors_reported():
        fields: dict[str, Any] = {"name": name, "admin": admin, "weight": weight}
        if max_running_jobs is not None:
            fields["max_running_jobs"] = max_running_jobs
        if max_priority is not None:
            fields["max_priority"] = max_priority
        if max_disk_mb is not None:
            fields["max_disk_mb"] = max_disk_mb
        try:
            spec = parse_model(TenantSpec, fields)
        except SpecError as err:
            raise CliError("invalid tenant", EXIT_USAGE, [p.__dict__ for p in err.problems]) from None
        with connect(admin=True) as client:
            created = client.create_tenant(spec, force=force)

    def render(t: dict[str, Any]) -> None:
        console.print(f"created tenant {t['name']}; its token (shown once, keep it safe):", markup=False)
        typer.echo(t["token"])

    emit(created, output, render)


@app.command("set")
def set_(
    name: Annotated[str, typer.Argument(help="The tenant to change.")],
    max_running_jobs: Annotated[int | None, typer.Option(help="Quota: jobs admitted at once (0: no limit).")] = None,
    weight: Annotated[float | None, typer.Option(help="Fair-share weight, 0.001 to 1000.")] = None,
    max_priority: Annotated[
        str | None,
        typer.Option(
            metavar="N|none",
            help="The highest priority its jobs may have (-1000..1000), or 'none' to remove the cap. Checked at "
            "submit and resume; jobs already accepted keep their priority.",
        ),
    ] = None,
    max_disk_mb: Annotated[
        int | None,
        typer.Option(help="MiB its jobs' run folders may hold, ended jobs' included (0: no cap)."),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Change a tenant's weight, job quota, disk cap or priority cap live (admin)."""
    with errors_reported():
        given = {"max_running_jobs": max_running_jobs, "weight": weight, "max_disk_mb": max_disk_mb}
        fields: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        if max_priority is not None:
            fields["max_priority"] = _cap(max_priority)
        try:
            patch = parse_model(TenantPatch, fields)
        except SpecError as err:
            raise CliError("invalid tenant change", EXIT_USAGE, [p.__dict__ for p in err.problems]) from None
        with connect(admin=True) as client:
            t = client.update_tenant(name, patch)
    emit(
        t,
        output,
        lambda t: console.print(
            f"tenant {t['name']}: weight {t['weight']:g}, max running {t['max_running_jobs'] or 'no limit'}, "
            f"max priority {_shown_cap(t)}, max disk {_shown_disk(t)}",
            markup=False,
        ),
    )


@app.command("list")
def list_(output: OutputOpt = Output.table) -> None:
    """Every tenant with its role and quota (never tokens)."""
    with errors_reported(), connect(admin=True) as client:
        tenants = client.tenants()

    def render(rows: list[dict[str, Any]]) -> None:
        table(
            ["NAME", "ADMIN", "MAX RUNNING", "MAX PRIORITY", "MAX DISK MIB", "WEIGHT", "CREATED"],
            [
                [
                    t["name"],
                    "yes" if t["admin"] else "",
                    t["max_running_jobs"] or "",
                    "" if t.get("max_priority") is None else t["max_priority"],
                    t.get("max_disk_mb") or "",
                    t["weight"],
                    when(t["created_at"]),
                ]
                for t in rows
            ],
        )

    emit(tenants, output, render)


@app.command()
def delete(
    name: Annotated[
        str, typer.Argument(help="The tenant to delete (it must have no unfinished jobs and no datasets).")
    ],
) -> None:
    """Delete a tenant for good; its token stops working at once. The built-in admin and
    default tenants cannot be deleted (the CLI's own tokens).

    Its queue grants go with it. Its name, like its uid, is never given to another tenant:
    `tenant create` of that name is refused, so the deleted tenant's jobs, logs and
    checkpoints (kept, for an admin to read) never come to belong to a newcomer. Refused while
    the tenant has unfinished jobs (suspended ones too) or datasets, which are named."""
    with errors_reported(), connect(admin=True) as client:
        client.delete_tenant(name)
    console.print(f"deleted tenant {name}", markup=False)
