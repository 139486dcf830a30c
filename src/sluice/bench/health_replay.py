"""Replay a recorded health campaign through a fresh health monitor, offline.

A live campaign (`sluice bench health --campaign --out X.json`) takes an hour and its faults
land where chance puts them, so a change to the monitor (a threshold rule, a refit schedule)
cannot be judged by running a new campaign and comparing. The campaign's trace
(`X.trace.jsonl`) holds, per second, each node's judged KPIs, the scheduling-change grace
the live monitor was under, and which fault was running; `replay` feeds those samples in
order to a new `HealthMonitor` (today's code, or a config under test) and reports per fault
whether it cordoned the node and after how long, next to what the live monitor did, and
every cordon no fault explains.

Where a replay differs from the live loop, and why that is acceptable:
- The KPIs are the recorded ones, whatever the replayed monitor decides: a node it cordons
  later than the live one did still shows the jobs the live one moved away. Catches and
  delays are comparable; what happened to jobs is not replayed.
- A fault that starts while the replayed monitor still has its node out of service (the live
  one had readmitted it, or never cordoned it) cannot be cordoned again: it is reported as
  `out of service`, not as a miss, and left out of the share caught.
- Traces recorded before the grace was written (no `grace_s`) replay without grace: the
  replayed monitor then alarms at least as often as the live one, a harsher test for false
  cordons.
- A refit takes effect at the sample it falls due, not seconds later on a thread; the
  detector's initialisation is seeded, so one replay of one trace is repeatable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sluice.bench.health_campaign import CORDON_GOAL_S, EXPLAINED_AFTER_S
from sluice.health.monitor import MACHINE_WIDE, HealthMonitor, MonitorConfig
from sluice.health.spot import DSpot
from sluice.model import NodeHealth, NodeKPIs


@dataclass
class ReplayedFault:
    """One fault of the trace; times in seconds from the campaign's start."""

    n: int
    node: str
    kind: str
    start_s: float
    end_s: float
    out_of_service: bool = False
    """The replayed monitor had the node cordoned when the fault began."""
    cordon_after_s: float | None = None
    live_cordon_after_s: float | None = None


@dataclass
class ReplayResult:
    faults: list[ReplayedFault]
    false_cordons: list[tuple[str, float, str]] = field(default_factory=list)
    """(node, second, reason) of each cordon no fault explains."""
    graced: bool = False
    """Whether the trace carried the live monitor's grace (recorded from this version on)."""
    thresholds: dict[str, list[float]] = field(default_factory=dict)
    """Per node, every threshold the replayed monitor fitted (for the largest and last); for
    a drift-aware threshold, the threshold on the excess over the recent level."""
    drift_aware: bool = False
    """Whether the replayed monitor's thresholds were drift-aware (`dspot`)."""
    false_alarms: dict[str, int] = field(default_factory=dict)
    """Per node, alarms counted (not held by a grace) while no fault ran there: how close the
    healthy scores came to a cordon. A cordon needs several within its window."""

    @property
    def judged(self) -> list[ReplayedFault]:
        return [f for f in self.faults if not f.out_of_service]

    @property
    def caught(self) -> int:
        return sum(1 for f in self.judged if f.cordon_after_s is not None and f.cordon_after_s <= CORDON_GOAL_S)

    @property
    def live_caught(self) -> int:
        return sum(
            1 for f in self.faults if f.live_cordon_after_s is not None and f.live_cordon_after_s <= CORDON_GOAL_S
        )


def ticks(trace: Path) -> Iterator[dict[str, Any]]:
    with trace.open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def result_path(trace: Path) -> Path:
    """The campaign's result JSON beside its trace (`X.trace.jsonl` -> `X.json`)."""
    name = trace.name.removesuffix(".jsonl").removesuffix(".trace")
    return trace.with_name(name + ".json")


def _faults(rows: list[dict[str, Any]], result: Path | None) -> list[ReplayedFault]:
    spans: dict[int, list[float]] = {}
    for tick in rows:
        n = tick.get("fault")
        if n is not None:
            spans.setdefault(int(n), []).append(float(tick["t"]))
    faults = {n: ReplayedFault(n, "", "", ts[0], ts[-1]) for n, ts in sorted(spans.items())}
    if result is not None and result.exists():
        for rec in json.loads(result.read_text()).get("faults", []):
            f = faults.get(int(rec["n"]))
            if f is not None:
                f.node, f.kind, f.live_cordon_after_s = str(rec["node"]), str(rec["kind"]), rec.get("cordon_after_s")
    return list(faults.values())


def replay(
    trace: Path,
    result: Path | None = None,
    config: MonitorConfig | None = None,
    threshold: str | None = None,
    window_steps: int | None = None,
) -> ReplayResult:
    """Replay `trace` (a campaign's `.trace.jsonl`) through a new monitor with `config`
    (default: the campaign's, virtual nodes judged on their own KPIs), its threshold rule
    replaced by `threshold` and its node models' modelled window (`DetectorConfig.target`,
    the live default 1, the offline one 4) by `window_steps` if given. `result` (the campaign's `.json`, default the one
    beside the trace) names each fault's node and kind and the live cordon delay; without it
    a fault's node is the first the live monitor took out of Healthy during the fault."""
    base = config or MonitorConfig(ignore=("jobs", *MACHINE_WIDE))
    if threshold is not None:
        base = replace(base, threshold=threshold)
    if window_steps is not None:
        base = replace(base, detector=replace(base.detector, target=window_steps))
    mon = HealthMonitor(replace(base, background=False, models_dir=None))
    rows = list(ticks(trace))  # read once: the fault windows come from the same ticks
    faults = _faults(rows, result_path(trace) if result is None else result)
    by_n = {f.n: f for f in faults}
    out = ReplayResult(faults)
    shown = 0
    for tick in rows:
        t = float(tick["t"])
        running = by_n.get(int(tick["fault"])) if tick.get("fault") is not None else None
        nodes = {k: v for k, v in tick.items() if isinstance(v, dict) and v.get("kpis")}
        if running is not None and not running.node:
            running.node = next((n for n, st in nodes.items() if st.get("health") != str(NodeHealth.HEALTHY)), "")
        if running is not None and t == running.start_s and running.node in mon.nodes:
            running.out_of_service = mon.nodes[running.node].machine.state == NodeHealth.CORDONED
        for node, st in nodes.items():
            if "grace_s" in st:
                out.graced = True
                if float(st["grace_s"]) > 0:
                    mon.note_change(node, t, "recorded grace", float(st["grace_s"]))
            before = mon.nodes[node].alarms if node in mon.nodes else 0
            mon.score(NodeKPIs(node, t, {k: float(v) for k, v in st["kpis"].items()}), settle=False)
            if mon.nodes[node].alarms > before and not _in_fault(out.faults, node, t):
                out.false_alarms[node] = out.false_alarms.get(node, 0) + 1
        mon.settle(t)
        for node, tr in mon.nodes.items():
            fitted = tr.spot.spot if isinstance(tr.spot, DSpot) else tr.spot
            out.drift_aware = out.drift_aware or isinstance(tr.spot, DSpot)
            if fitted is not None and math.isfinite(fitted.threshold):
                seen = out.thresholds.setdefault(node, [])
                if not seen or seen[-1] != fitted.threshold:
                    seen.append(float(fitted.threshold))
        for tr_ in mon.transitions[shown:]:
            if tr_.new == NodeHealth.CORDONED:
                _account(out, tr_.node, tr_.time, tr_.reason)
        shown = len(mon.transitions)
    return out


def _in_fault(faults: list[ReplayedFault], node: str, t: float) -> bool:
    return any(f.node == node and f.start_s - 1.0 <= t <= f.end_s + EXPLAINED_AFTER_S for f in faults)


def _account(out: ReplayResult, node: str, t: float, reason: str) -> None:
    for f in out.faults:
        if f.node == node and f.start_s - 1.0 <= t <= f.end_s + EXPLAINED_AFTER_S:
            if f.cordon_after_s is None:
                f.cordon_after_s = max(0.0, t - f.start_s)
            return
    out.false_cordons.append((node, t, reason))


def report(console: Console, r: ReplayResult) -> None:
    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f}"

    table = Table(title="replayed campaign: cordon delay per fault (s), replay vs live")
    for col in ("fault", "kind", "node", "replay", "live"):
        table.add_column(col, justify="right" if col in ("fault", "replay", "live") else "left")
    for f in r.faults:
        table.add_row(
            str(f.n),
            f.kind,
            f.node,
            "out of service" if f.out_of_service else s(f.cordon_after_s),
            s(f.live_cordon_after_s),
        )
    console.print(table)
    console.print(
        f"replay: {r.caught}/{len(r.judged)} faults cordoned within {CORDON_GOAL_S:g}s "
        f"({len(r.faults) - len(r.judged)} fell on a node the replay still had cordoned), "
        f"{len(r.false_cordons)} false cordons; live: {r.live_caught}/{len(r.faults)}",
        markup=False,
    )
    for node, t, why in r.false_cordons:
        console.print(f"  false cordon: {node} at {t:.0f}s: {why}", markup=False)
    what = "thresholds on the excess over the recent level" if r.drift_aware else "thresholds"
    for node, ths in sorted(r.thresholds.items()):
        console.print(
            f"  {node}: {len(ths)} {what}, largest {max(ths):.4g}, last {ths[-1]:.4g}; "
            f"{r.false_alarms.get(node, 0)} alarms counted while no fault ran there",
            markup=False,
        )
    if not r.graced:
        console.print("  (the trace carries no grace: alarms the live monitor held count here)", markup=False)
