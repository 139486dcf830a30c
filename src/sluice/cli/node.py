"""`sluice node ...`: Nodes: list, why, cordon, uncordon, fault."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from sluice.cli.client import connect
from sluice.cli.output import (
    Output,
    OutputOpt,
    bad_input,
    console,
    emit,
    err_console,
    errors_reported,
    in_range,
    number,
    stamp,
    table,
)

app = typer.Typer(help="Nodes: list, cordon, uncordon, inject faults.", no_args_is_help=True)

MIN_FAULT_S, MAX_FAULT_S = 0.1, 3600
MAX_FAULT_MEMORY_MB = 1 << 20  # the API's bound (FaultIn.memory_mb): refused here, before a round trip
"""`node fault --seconds` bounds (the API's: FaultIn.seconds)."""

NodeName = Annotated[str, typer.Argument(help="Node name (as `sluice node list` shows it).")]


@app.command("list")
def list_(output: OutputOpt = Output.table) -> None:
    """Every node: CPUs, GPUs, health and why, jobs and CPU handed out."""
    with errors_reported(), connect() as client:
        nodes = client.nodes()

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
    """Take a node out of service: nothing new is placed; its jobs move off via checkpoints (admin).
    Says how many jobs that moves, and warns when no other node can take them."""
    with errors_reported(), connect(admin=True) as client:
        node = client.cordon(name, reason)

    def render(n: dict[str, Any]) -> None:
        console.print(f"{name}: {n.get('health', 'Cordoned')} — {reason}", markup=False)
        moved = n.get("moved_jobs")
        if moved is None:  # a server that does not say
            return
        if not moved:
            console.print("no running job to move", markup=False)
            return
        ids = ", ".join(moved)
        console.print(f"{len(moved)} job(s) move off it through their checkpoints: {ids}", markup=False)
        if n.get("other_schedulable_nodes") == 0:
            err_console.print(
                f"warning: no other node is schedulable, so the {len(moved)} job(s) will wait until "
                f"a node joins or `sluice node uncordon {name}`",
                markup=False,
            )

    emit(node, output, render)


@app.command()
def uncordon(name: NodeName, output: OutputOpt = Output.table) -> None:
    """Put a node back in service (admin)."""
    with errors_reported(), connect(admin=True) as client:
        node = client.uncordon(name)
    emit(node, output, lambda n: console.print(f"{name}: {n.get('health', 'Healthy')}", markup=False))


@app.command()
def why(name: NodeName, output: OutputOpt = Output.table) -> None:
    """Why a node is Healthy, Suspect or Cordoned: its reason, and the KPIs behind the health
    monitor's newest alarm there (share, value then, what the node's model learned as healthy)."""
    with errors_reported(), connect() as client:
        out = client.node_why(name)

    def render(o: dict[str, Any]) -> None:
        console.print(f"{name}: {o.get('health', '')}" + (f" — {o['reason']}" if o.get("reason") else ""), markup=False)
        if not o.get("monitored"):
            console.print("no health monitor watches this node (SLUICE_HEALTH_ENABLED=1 turns it on)", markup=False)
            return
        if o.get("state") == "learning":
            # Not scored yet: a blank score read as "scored, nothing to say" (walkthrough 4).
            console.print(
                f"learning the node's model: {o.get('healthy_samples') or 0}/{o.get('train_samples') or '?'} "
                "healthy samples; nothing is scored until it is fitted",
                markup=False,
            )
        elif o.get("score") is None:
            # A saved model loaded at start, no sample scored yet: it said `score  (threshold -3.3)`.
            console.print(
                f"no sample scored yet since the plane started (threshold {number(o.get('threshold'), 4) or '?'})",
                markup=False,
            )
        else:
            at = f" at {stamp(o['scored_at'])}" if o.get("scored_at") else ""
            refit = "; a newer model is being fitted" if o.get("state") == "refitting" else ""
            console.print(
                f"score {number(o.get('score'), 4)} (threshold {number(o.get('threshold'), 4)}){at}{refit}",
                markup=False,
            )
        console.print(
            f"{o.get('alarms', 0)} alarms counted, {o.get('held', 0)} held during scheduling changes",
            markup=False,
        )
        alarm = o.get("alarm")
        if not alarm:
            console.print("no alarm counted yet", markup=False)
            return
        import time

        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(alarm["time"]))
        console.print(
            f"newest alarm at {when}: score {number(alarm['score'], 4)} > {number(alarm['threshold'], 4)}",
            markup=False,
        )
        sampled = alarm.get("sample_time")
        if sampled is not None and sampled != alarm["time"]:
            # The score averages several windows; the values below are from the least likely one.
            console.print(
                f"values from the sample at {time.strftime('%H:%M:%S', time.localtime(sampled))} "
                f"({alarm['time'] - sampled:.0f} s before), the least likely of those the score averages",
                markup=False,
            )
        table(
            ["KPI", "SHARE", "VALUE", "HEALTHY MEAN", "± SPREAD"],
            [
                [
                    k["kpi"],
                    f"{100 * k['share']:.0f}%",
                    number(k["value"], 4),
                    number(k.get("healthy_mean"), 4),
                    number(k.get("healthy_spread"), 3),
                ]
                for k in alarm.get("kpis", [])
            ],
        )

    emit(out, output, render)


class FaultKindOpt(StrEnum):
    cpu = "cpu"
    memory = "memory"
    io = "io"
    net = "net"


@app.command()
def fault(
    name: NodeName,
    kind: Annotated[
        FaultKindOpt | None,
        typer.Argument(
            help="cpu (busy loops), memory (hold RAM), io (write + fsync storm), net (TCP flood over "
            "loopback). Omit with --stop."
        ),
    ] = None,
    seconds: Annotated[
        float, typer.Option("--seconds", "-s", help="How long, 0.1 to 3600 seconds (it stops by itself).")
    ] = 60.0,
    workers: Annotated[
        int | None, typer.Option(min=1, max=64, help="cpu/io/net workers (default: one per core).")
    ] = None,
    memory_mb: Annotated[
        int | None,
        typer.Option(min=1, max=MAX_FAULT_MEMORY_MB, help="RAM a memory fault holds (MiB; memory faults only) [512]."),
    ] = None,
    stop: Annotated[bool, typer.Option("--stop", help="Stop every fault running on the node now.")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Make a node sick on purpose, pinned to its cores, for a while (admin): to watch the
    health loop flag it, cordon it and move its jobs (`sluice node list`, `sluice job why`)."""
    in_range("--seconds", seconds, MIN_FAULT_S, MAX_FAULT_S)
    if stop and kind is not None:
        bad_input("KIND/--stop", "give a fault KIND to start one, or --stop to stop the node's faults, not both")
    if not stop and kind is None:
        bad_input("KIND", "give a fault KIND (cpu, memory, io, net), or --stop to stop the node's faults")
    if stop and (workers is not None or memory_mb is not None):
        bad_input("--stop", "stops every fault on the node; it takes no --workers or --memory-mb")
    with errors_reported(), connect(admin=True) as client:
        if stop:
            out = client.stop_faults(name)
            emit(out, output, lambda o: console.print(f"{name}: {o.get('stopped', 0)} fault(s) stopped", markup=False))
            return
        assert kind is not None
        out = client.inject_fault(name, kind.value, seconds, workers, memory_mb)

    def render(o: dict[str, Any]) -> None:
        cores = ",".join(map(str, o.get("cores", [])))
        console.print(
            f"{name}: {o.get('kind')} fault for {number(o.get('seconds'), 3)}s on cores {cores} "
            f"(pids {', '.join(map(str, o.get('pids', [])))}): {o.get('command', '')}",
            markup=False,
        )

    emit(out, output, render)
