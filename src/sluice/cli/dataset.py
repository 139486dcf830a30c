"""`sluice dataset ...`: Datasets cached next to the jobs that read them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from sluice.cli.client import EXIT_USAGE, CliError, connect
from sluice.cli.output import Output, OutputOpt, console, emit, errors_reported, size_text, table, when
from sluice.spec import SpecError
from sluice.spec.loading import load_dataset_spec

app = typer.Typer(help="Datasets cached next to the jobs that read them.", no_args_is_help=True)

Name = Annotated[str, typer.Argument(help="The dataset's name.")]


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:.0%}"


def _rows(items: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            d["name"],
            d["tenant"] + (" (published)" if d.get("published") else ""),
            d["source"],
            d["items"],
            size_text(d["total_bytes"]),
            _pct(d.get("cached_fraction")),
            ", ".join(f"{n} {_pct(f)}" for n, f in (d.get("cached_on") or {}).items()) or "-",
            when(d["created_at"]),
        ]
        for d in items
    ]


COLUMNS = ("NAME", "TENANT", "SOURCE", "FILES", "SIZE", "CACHED HERE", "CACHED ON NODES", "CREATED")


@app.command()
def create(
    file: Annotated[Path, typer.Argument(help="Dataset spec (YAML or JSON): name, source, ...", dir_okay=False)],
    no_probe: Annotated[bool, typer.Option("--no-probe", help="Do not list the source now.")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Register a dataset. Its source is listed now, so a wrong URL fails here, not in a job."""
    with errors_reported():
        try:
            spec = load_dataset_spec(file)  # a relative local source is taken from the file's folder
        except SpecError as err:
            raise CliError(f"invalid dataset spec {file}", EXIT_USAGE, [p.__dict__ for p in err.problems]) from None
        with connect() as client:
            ds = client.create_dataset(spec, probe=not no_probe)
    emit(
        ds,
        output,
        lambda d: console.print(
            f"created dataset {d['name']} ({d['items']} files, {size_text(d['total_bytes'])})", markup=False
        ),
    )


@app.command("list")
def list_(output: OutputOpt = Output.table) -> None:
    """Your datasets and the published ones (every tenant's with an admin token), and how much
    of each the nodes cache."""
    with errors_reported(), connect() as client:
        items = client.datasets()
    emit(items, output, lambda ds: table(COLUMNS, _rows(ds)))


Owner = Annotated[
    str | None, typer.Option("--tenant", help="The tenant owning the dataset (admin). Default: your own.")
]


@app.command()
def get(name: Name, tenant: Owner = None, output: OutputOpt = Output.table) -> None:
    """One dataset."""
    with errors_reported(missing=f"dataset {name!r}"), connect(admin=tenant is not None) as client:
        d = client.dataset(name, tenant)
    emit(d, output, lambda x: table(COLUMNS, _rows([x])))


def _warm_line(name: str, n: dict[str, Any]) -> str:
    if n.get("error"):
        return f"{n['node']}: warming {name} failed after {n['seconds']:.1f} s: {n['error']}"
    return (
        f"{n['node']}: {n['cached_fraction']:.0%} cached — fetched {n['files_fetched']} files "
        f"({size_text(n['bytes_fetched'])}) in {n['seconds']:.1f} s, {n['already_cached']} already cached"
    )


@app.command()
def warm(
    name: Name,
    node: Annotated[
        list[str] | None, typer.Option("--node", help="Warm only this node (repeatable). Default: every node.")
    ] = None,
    tenant: Owner = None,
    output: OutputOpt = Output.table,
) -> None:
    """Fetch the whole dataset into the cache of every node now (or the --node ones), so the
    first epoch reads it warm there. Prints, per node, what was fetched and how long it took."""
    with (
        errors_reported(missing=f"dataset {name!r}"),
        connect(admin=tenant is not None) as client,
        console.status(f"warming {name} ..."),
    ):
        res = client.warm_dataset(name, nodes=node or (), tenant=tenant)
    emit(res, output, lambda r: console.print("\n".join(_warm_line(name, n) for n in r["nodes"]), markup=False))
    failed = [n.node for n in res.nodes if n.error]
    if failed:
        raise typer.Exit(1)


def _publish(
    name: str, tenant: str | None, published: bool, output: Output, verb: str, with_credentials: bool = False
) -> None:
    with errors_reported(missing=f"dataset {name!r}"), connect(admin=True) as client:  # admin.token first
        d = client.publish_dataset(name, tenant, published=published, with_credentials=with_credentials)
    emit(d, output, lambda x: console.print(f"{verb} dataset {x['name']} of tenant {x['tenant']}", markup=False))


@app.command()
def publish(
    name: Name,
    tenant: Owner = None,
    with_credentials: Annotated[
        bool,
        typer.Option(
            "--with-credentials",
            help="Publish it although it holds credentials (storage options key, secret, token, or a password "
            "in its source URL): every tenant's job that mounts it gets them. Without this, such a dataset is refused.",
        ),
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Publish a dataset to every tenant (admin token): any tenant may then list, read and mount
    it by name and jobs share its cache; only its owner or an admin can delete it."""
    _publish(name, tenant, True, output, "published", with_credentials)


@app.command()
def unpublish(name: Name, tenant: Owner = None, output: OutputOpt = Output.table) -> None:
    """Withdraw a published dataset (admin token): it is its owner's alone again."""
    _publish(name, tenant, False, output, "withdrew")


@app.command("rm")
def rm(name: Name, tenant: Owner = None) -> None:
    """Delete a dataset and drop it from every node's cache (its source is not touched)."""
    with errors_reported(missing=f"dataset {name!r}"), connect(admin=tenant is not None) as client:
        out = client.delete_dataset(name, tenant)
    console.print(f"deleted dataset {name}", markup=False)
    for node, what in sorted(out.nodes.items()):
        console.print(f"  {node}: {what}", markup=False)
