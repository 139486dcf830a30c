"""`sluice priority ...`: named priority classes (docs/queues.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from sluice.cli.client import EXIT_USAGE, CliError, connect
from sluice.cli.output import Output, OutputOpt, console, emit, errors_reported, table
from sluice.spec import PriorityClassSpec, SpecError
from sluice.spec.loading import parse_model

app = typer.Typer(help="Named priority classes jobs use with `priority_class`.", no_args_is_help=True)


def _line(p: dict[str, Any]) -> None:
    extra = (", default" if p["default"] else "") + (", never preempts" if p["preemption"] == "never" else "")
    console.print(f"priority class {p['name']}: value {p['value']}{extra}", markup=False)


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="The class's name.")],
    value: Annotated[int, typer.Option(help="The priority its jobs get (-1000..1000, higher goes first).")],
    description: Annotated[str, typer.Option(help="What it is for.")] = "",
    preemption: Annotated[str, typer.Option(help="allowed or never: whether its jobs preempt lower ones.")] = "allowed",
    default: Annotated[bool, typer.Option("--default", help="Apply it to jobs that set no priority.")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Create a priority class (admin)."""
    with errors_reported():
        raw = {"name": name, "value": value, "description": description, "preemption": preemption, "default": default}
        try:
            spec = parse_model(PriorityClassSpec, raw)
        except SpecError as err:
            raise CliError("invalid priority class", EXIT_USAGE, [p.__dict__ for p in err.problems]) from None
        with connect(admin=True) as client:
            p = client.create_priority_class(spec)
    emit(p, output, _line)


@app.command("list")
def list_(output: OutputOpt = Output.table) -> None:
    """Every priority class."""
    with errors_reported(), connect() as client:
        items = client.priority_classes()
    emit(
        items,
        output,
        lambda ps: table(
            ["NAME", "VALUE", "PREEMPTION", "DEFAULT", "DESCRIPTION"],
            [
                [p["name"], str(p["value"]), p["preemption"], "yes" if p["default"] else "", p["description"]]
                for p in ps
            ],
        ),
    )


@app.command()
def delete(name: Annotated[str, typer.Argument(help="The class's name.")]) -> None:
    """Delete a priority class (admin); refused while an unfinished job uses it."""
    with errors_reported(), connect(admin=True) as client:
        client.delete_priority_class(name)
    console.print(f"deleted priority class {name}", markup=False)
