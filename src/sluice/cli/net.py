"""`sluice net ...`: the network-stack lab: measure container datapaths, recommend one."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import psutil
import typer

from sluice.cli.client import EXIT_FAILURE, EXIT_USAGE, CliError
from sluice.cli.output import Output, OutputOpt, console, emit, err_console, errors_reported, table

app = typer.Typer(help="The network-stack lab: measure container datapaths, recommend one.", no_args_is_help=True)

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20}
_IFACE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"{text!r} is not a size (like 1K, 64KiB, 256M)")
    n = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if not 4 <= n <= 1 << 30:
        raise ValueError(f"{text!r}: sizes go from 4 B to 1 GiB")
    return n


def _csv(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


@contextmanager
def _lab_errors() -> Iterator[None]:
    """The lab's own refusals (privileges, missing tools) become a message and exit code 2."""
    from sluice.net.ipcmd import NetLabError

    with errors_reported():
        try:
            yield
        except NetLabError as err:
            raise CliError(str(err), EXIT_USAGE) from err


@app.command()
def detect(output: OutputOpt = Output.table) -> None:
    """Probe which datapath parts this kernel has (in a throw-away namespace)."""
    from sluice.net.datapaths import availability
    from sluice.net.detect import detect as probe
    from sluice.net.lab import Lab

    with _lab_errors(), Lab() as lab:
        found = probe(lab)
    avail = availability(found)
    data = {"features": {k: v.to_json() for k, v in found.items()}, "datapaths": avail}

    def render(d: dict[str, Any]) -> None:
        table(
            ("FEATURE", "PRESENT", "DETAIL"),
            [[k, "yes" if v["ok"] else "NO", v["reason"]] for k, v in d["features"].items()],
        )
        table(
            ("DATAPATH", "BUILDABLE", "WHY NOT"),
            [[k, "yes" if v is None else "no", v or ""] for k, v in d["datapaths"].items()],
        )

    emit(data, output, render)


@app.command()
def bench(
    datapaths: Annotated[
        str | None, typer.Option(help="Comma-separated datapaths (default: all buildable here).")
    ] = None,
    skip: Annotated[str | None, typer.Option(help="Measurements to skip: tcp,latency,allreduce,ddp,data.")] = None,
    duration: Annotated[int, typer.Option(min=1, max=120, help="Seconds per iperf3 run (whole seconds).")] = 5,
    repeats: Annotated[int, typer.Option(min=1, max=50, help="Repeats of each measurement.")] = 3,
    streams: Annotated[int, typer.Option(min=2, max=64, help="Parallel TCP streams of the multi-stream run.")] = 4,
    rr_count: Annotated[int, typer.Option(min=10, max=1_000_000, help="Round trips per latency run.")] = 2000,
    sizes: Annotated[str, typer.Option(help="All-reduce message sizes, or 'full' (1K..256M by 4x).")] = "full",
    rounds: Annotated[int, typer.Option(min=1, max=1000, help="Timed all-reduce rounds per size (at most).")] = 10,
    ddp_steps: Annotated[int, typer.Option(min=10, max=100_000, help="Steps of the data-parallel example.")] = 60,
    data_files: Annotated[int, typer.Option(min=1, max=100_000, help="Small files (64 KiB) read remotely.")] = 200,
    large_mb: Annotated[int, typer.Option(min=1, max=4096, help="Size of each of the 4 large files (MiB).")] = 32,
    mtu: Annotated[
        int, typer.Option(min=576, max=65535, help="MTU of the nodes' link (tunnels take their header off).")
    ] = 1500,
    out: Annotated[Path | None, typer.Option(help="Write the results as JSON here.")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Build each datapath between two namespace "nodes" and measure it (needs root)."""
    from sluice.net.bench import FULL_SIZES, BenchConfig, run_bench
    from sluice.net.report import COLUMNS, rows

    with errors_reported():
        try:
            size_list = FULL_SIZES if sizes == "full" else tuple(parse_size(s) for s in _csv(sizes))
            if not size_list:
                raise ValueError("give at least one size")
        except ValueError as err:
            raise CliError(f"--sizes: {err}", EXIT_USAGE) from err
        try:
            cfg = BenchConfig(
                datapaths=_csv(datapaths) or None, skip=set(_csv(skip)), mtu=mtu, duration_s=duration,
                streams=streams, repeats=repeats, rr_count=rr_count, sizes=size_list, allreduce_rounds=rounds,
                ddp_steps=ddp_steps, data_small=data_files, data_large_mb=large_mb,
            )  # fmt: skip
        except ValueError as err:
            raise CliError(str(err), EXIT_USAGE) from err
    say = (lambda s: None) if output == Output.json else (lambda s: console.print(f"[dim]{s}[/]"))
    with _lab_errors():
        results = run_bench(cfg, say=say)
    if out is not None:
        out.write_text(json.dumps(results, indent=1))

    def render(r: dict[str, Any]) -> None:
        table(COLUMNS, rows(r), title=f"sluice net bench, run {r['run_id']} (medians ± half-range over repeats)")
        for name, why in r["unavailable"].items():
            console.print(f"not built: {name}: {why}", markup=False)
        for name, d in r["datapaths"].items():
            for t in (d.get("ddp") or {}).get("teardown_failed", []) if isinstance(d, dict) else []:
                exits = ", ".join(t["exits"])
                console.print(f"{name}: ddp repeat {t['repeat']}: all steps ran, then the ranks ended: {exits} (!)",
                              markup=False)  # fmt: skip
        console.print(f"load average before/after: {r['machine']['loadavg']} / {r['machine']['loadavg_after']}")
        if out is not None:
            console.print(f"results written to {out}", markup=False)

    emit(results, output, render)


@app.command()
def recommend(
    results: Annotated[
        Path, typer.Option(help="JSON written by `sluice net bench --out`.", exists=True, dir_okay=False)
    ],
    profile: Annotated[
        str, typer.Option(help="allreduce (bandwidth-bound), latency (small messages) or data.")
    ] = "allreduce",
    allow_host: Annotated[bool, typer.Option(help="Consider host networking (no isolation between tenants).")] = False,
    apply: Annotated[
        bool, typer.Option(help="Write net_interface to $SLUICE_HOME/settings.yaml for jobs sluice starts.")
    ] = False,
    interface: Annotated[
        str | None, typer.Option(help="With --apply: the interface on your nodes that carries the chosen datapath.")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Pick a datapath for a job profile from bench results, with the numbers behind it."""
    from sluice.net.recommend import PROFILES, NoCandidate, from_results
    from sluice.net.recommend import recommend as choose

    with errors_reported():
        if profile not in PROFILES:
            raise CliError(f"--profile: {profile!r} is not one of {', '.join(PROFILES)}", EXIT_USAGE)
        if apply and not interface:
            raise CliError("--apply needs --interface: the lab cannot know which of your nodes' interfaces "
                           "carries the chosen datapath", EXIT_USAGE)  # fmt: skip
        if interface is not None and not _IFACE.match(interface):
            raise CliError(
                f"--interface: {interface!r} is not an interface name (1-15 of A-Z a-z 0-9 _ . -)", EXIT_USAGE
            )
        try:
            data = json.loads(results.read_text())
            measured = from_results(data)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
            raise CliError(f"--results: {results} is not `sluice net bench` output: {err}", EXIT_USAGE) from err
        try:
            rec = choose(measured, profile, allow_host=allow_host)
        except NoCandidate as err:
            raise CliError(str(err), EXIT_FAILURE) from err
        doc = rec.to_json()
        if apply and interface:
            doc["applied"] = str(_apply(interface, doc, results))

    def render(d: dict[str, Any]) -> None:
        console.print(f"[bold]{d['profile']}: use {d['datapath']}[/]")
        for line in d["reasons"]:
            console.print(line, markup=False)
        for name, why in d["excluded"].items():
            console.print(f"  not considered: {name}: {why}", markup=False)
        if "applied" in d:
            console.print(
                f"net_interface set in {d['applied']}; jobs started from now get GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME"
            )
            if interface and interface not in psutil.net_if_addrs():
                err_console.print(
                    f"warning: this machine has no interface {interface!r}: a plane on the local engine here "
                    "will refuse to start until it does (every node of it must have it)",
                    markup=False,
                )

    emit(doc, output, render)


def _apply(interface: str, doc: dict[str, Any], results: Path) -> Path:
    """Set net_interface in $SLUICE_HOME/settings.yaml (other keys kept) and keep the why beside it."""
    import yaml

    from sluice.settings import load_settings

    home = load_settings().home
    home.mkdir(parents=True, exist_ok=True)
    file = home / "settings.yaml"
    current = yaml.safe_load(file.read_text()) if file.exists() else {}
    if not isinstance(current, dict):
        raise CliError(f"{file} is not a mapping; fix it before --apply")
    current["net_interface"] = interface
    file.write_text(yaml.safe_dump(current, sort_keys=True))
    (home / "net-recommendation.json").write_text(
        json.dumps({**doc, "interface": interface, "results": str(results)}, indent=1)
    )
    return file


@app.command()
def clean(run: Annotated[str | None, typer.Option(help="Only this run id's leftovers.")] = None) -> None:
    """Remove the namespaces (and everything in them) a killed `sluice net bench` left behind."""
    from sluice.net.lab import clean as do_clean

    if run is not None and not (run.isalnum() and len(run) <= 8):
        with errors_reported():
            raise CliError(f"--run: {run!r} is not a run id (up to 8 letters or digits)", EXIT_USAGE)
    with _lab_errors():
        gone = do_clean(run)
    console.print(f"removed {len(gone)} namespace(s)" + (": " + ", ".join(gone) if gone else ""), markup=False)
