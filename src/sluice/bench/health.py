"""`sluice bench health`: the flow detector against PCA, Isolation Forest and an autoencoder
on a labelled folder (default: shared/data/anomaly/asd), averaged over its entities, with
the flow/best-baseline ratio of every quality metric and the issue's goals checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sluice.agent.faults import FaultKind
from sluice.control.plane import ControlPlane
from sluice.health.detector import DetectorConfig
from sluice.health.evaluation import EVAL_DECAY, EVAL_SMOOTH, average, contenders, evaluate_entity, load_folder
from sluice.health.monitor import HealthMonitor
from sluice.health.state import Transition

DEFAULT_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "anomaly" / "asd"
QUALITY = ("f1_best", "f1_spot", "f1_dspot", "f1_pa", "f1_pak", "auroc", "auprc")


def run(folder: Path, entities: list[str] | None = None, out: Path | None = None) -> dict[str, dict[str, float]]:
    console = Console()
    rows = []
    makers = contenders(DetectorConfig(smooth=EVAL_SMOOTH, decay=EVAL_DECAY))
    ents = list(load_folder(folder, entities))
    with console.status("scoring") as status:
        for ent in ents:
            for name, make in makers.items():
                status.update(f"{ent.name}: {name}")
                rows.append(evaluate_entity(ent, name, make))
    avg = average(rows)
    table = Table(title=f"mean over {len(ents)} entities of {folder}")
    table.add_column("detector")
    for m in (*QUALITY, "train_s", "windows_per_s"):
        table.add_column(m, justify="right")
    for det, a in avg.items():
        table.add_row(det, *(f"{a[m]:.3f}" for m in QUALITY), f"{a['train_s']:.1f}", f"{a['windows_per_s']:,.0f}")
    flow = avg["sluice-flow"]
    base = {k: v for k, v in avg.items() if k != "sluice-flow"}
    table.add_section()
    table.add_row(
        "flow / best baseline", *(f"{flow[m] / max(max(b[m] for b in base.values()), 1e-12):.2f}x" for m in QUALITY)
    )
    console.print(table)
    console.print("note: point-adjusted F1 (f1_pa) is inflated; compare on f1_best and auprc.")
    best_train = max(r.train_s for r in rows if r.detector == "sluice-flow")
    goals = {
        "beats every baseline on f1_best": all(flow["f1_best"] > b["f1_best"] for b in base.values()),
        "beats every baseline on auprc": all(flow["auprc"] > b["auprc"] for b in base.values()),
        "point-adjusted F1 >= 0.90": flow["f1_pa"] >= 0.90,
        "training <= 120 s per entity (slowest)": best_train <= 120.0,
        "scoring >= 10,000 windows/s": flow["windows_per_s"] >= 10_000,
    }
    for goal, ok in goals.items():
        console.print(f"{'met' if ok else 'NOT met'}: {goal}")
    if out is not None:
        out.write_text(json.dumps({"rows": [r.as_dict() for r in rows], "mean": avg, "goals": goals}, indent=1))
    return avg


def false_alarms(
    minutes: float,
    train_samples: int | None = None,
    virtual_nodes: int = 2,
    home: Path | None = None,
    inject_io_at_min: float | None = None,
    fault_s: float = 90.0,
) -> int:
    """Run the demo's mixed workload back to back for `minutes` on the local engine with the
    health monitor on (no fault injected) and count the cordons it makes: each is a false
    alarm. Prints every health transition as it happens and, however the run ends (time up
    mid-round, a failed round, Ctrl-C), the counts of cordons and Suspect episodes with
    their reasons. Returns the number of cordons.

    `inject_io_at_min`: instead, at that minute start a real I/O storm on the last node for
    `fault_s` seconds and also report how long the monitor took to make that node Suspect
    and Cordoned (detection with the model a long run has learned, not a fresh one)."""
    import tempfile
    import time

    from sluice.bench.scenario import embedded_plane, mixed_workload, run_workload

    console = Console(soft_wrap=True)  # one line per transition, also in a log file
    where = home or Path(tempfile.mkdtemp(prefix="sluice-health-fa-"))
    console.print(f"fault-free run: {minutes:g} min, state in {where} (kept; remove it when done)", markup=False)
    t0 = time.monotonic()
    end = t0 + 60 * minutes
    rounds = 0
    mon: HealthMonitor | None = None
    shown = 0
    fault: str | None = None
    fault_at: float | None = None
    fault_node = f"node-{virtual_nodes - 1}"

    def tick(plane: Any, *_: object) -> None:
        nonlocal fault, fault_at
        show_new()
        since = time.monotonic() - t0
        if inject_io_at_min is not None and fault_at is None and since >= 60 * inject_io_at_min:
            # Through the node's agent, as `sluice node fault` does: the storm runs inside the
            # node's own cgroups (and stops by itself after fault_s).
            report = plane.engine.inject_fault(fault_node, str(FaultKind.IO), fault_s, 2)
            fault, fault_at = fault_node, time.time()
            console.print(
                f"[{since:6.0f}s] injected an I/O storm on {fault_node} (cores {report.cores}) for {fault_s:g}s"
            )
        if fault is not None and fault_at is not None and time.time() - fault_at >= fault_s:
            fault = None
            console.print(f"[{since:6.0f}s] I/O storm on {fault_node} stopped")

    def show_new(*_: object) -> None:
        nonlocal shown
        for t in mon.transitions[shown:] if mon is not None else []:
            console.print(f"[{time.monotonic() - t0:6.0f}s] {t.node}: {t.old} -> {t.new}: {t.reason}")
            shown += 1

    try:
        # The plane's own health settings (SLUICE_HEALTH_*; default 300 learning samples)
        # unless the caller names a learning period: the run measures what ships.
        extra: dict[str, object] = {} if train_samples is None else {"health_train_samples": train_samples}
        with embedded_plane(where, "flowcon", health_enabled=True, virtual_nodes=virtual_nodes, **extra) as plane:
            mon = (
                plane.health
                if isinstance(plane.health, HealthMonitor)
                else _attach(plane, train_samples or 300, virtual_nodes)
            )
            while time.monotonic() < end:
                try:
                    run_workload(
                        plane,
                        mixed_workload(10.0, 0.5),
                        timeout_s=max(60.0, end - time.monotonic()),
                        on_tick=tick,
                        tick_s=1.0,
                    )
                except TimeoutError:
                    break  # the run's time is up mid-round; what counts is the alarms so far
                except Exception as err:  # report what was seen rather than lose the run
                    console.print(f"workload round {rounds + 1} failed: {err!r}; stopping the run")
                    break
                rounds += 1
    finally:
        show_new()
        if mon is not None:
            _summary(console, mon, (time.monotonic() - t0) / 60.0, rounds, virtual_nodes, fault_node, fault_at)
    return _cordons(mon, fault_node, fault_at)


def _attach(plane: ControlPlane, train_samples: int, virtual_nodes: int) -> HealthMonitor:
    """For a control plane that does not wire the monitor from settings."""
    from sluice.health.monitor import MACHINE_WIDE, MonitorConfig

    ignore = ("jobs", *MACHINE_WIDE) if virtual_nodes > 1 else ("jobs",)
    return plane.attach_health(MonitorConfig(train_samples=train_samples, ignore=ignore))


def _false(mon: HealthMonitor, fault_node: str, fault_at: float | None) -> list[Transition]:
    """Transitions not explained by the injected fault (any, when none was injected)."""
    return [t for t in mon.transitions if fault_at is None or t.node != fault_node or t.time < fault_at]


def _cordons(mon: HealthMonitor | None, fault_node: str = "", fault_at: float | None = None) -> int:
    from sluice.model import NodeHealth

    return 0 if mon is None else sum(1 for t in _false(mon, fault_node, fault_at) if t.new == NodeHealth.CORDONED)


def _summary(
    console: Console,
    mon: HealthMonitor,
    minutes: float,
    rounds: int,
    virtual_nodes: int,
    fault_node: str = "",
    fault_at: float | None = None,
) -> None:
    import time

    from sluice.model import NodeHealth

    if fault_at is not None:
        caught = [t for t in mon.transitions if t.node == fault_node and t.time >= fault_at]
        for state in (NodeHealth.SUSPECT, NodeHealth.CORDONED):
            first = next((t for t in caught if t.new == state), None)
            took = "not reached" if first is None else f"after {first.time - fault_at:.0f}s: {first.reason}"
            console.print(f"injected fault on {fault_node}: {state} {took}")
    false = _false(mon, fault_node, fault_at)
    suspects = [t for t in false if t.new == NodeHealth.SUSPECT]
    cordons = [t for t in false if t.new == NodeHealth.CORDONED]
    console.print(f"fault-free run: {minutes:.1f} min, {rounds} workload round(s), {virtual_nodes} virtual nodes")
    for node, st in mon.status().items():
        console.print(
            f"  {node}: {st['health']}, scored {st['scored']} samples, {st['alarms']} alarms counted, "
            f"{st['held']} held (scheduling changes), {st['fits']} fits (last on {st['trained_on']} samples)"
        )
    for t in (*suspects, *cordons):
        console.print(f"  {t.new} {t.node} at {time.strftime('%H:%M:%S', time.localtime(t.time))}: {t.reason}")
    console.print(f"suspect episodes: {len(suspects)}")
    console.print(f"cordons (false alarms): {len(cordons)}")
