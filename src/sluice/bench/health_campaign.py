"""`sluice bench health --campaign`: the whole health loop under load, fault after fault.

Runs the demo's mixed workload back to back on the local engine (virtual nodes, health
monitor on, the plane's own health settings) and, once every node's model is fitted, injects
a series of faults — every kind `sluice node fault` knows, in a seeded random order, on a
seeded random node, after a seeded random quiet gap — through the node's agent, exactly as
`sluice node fault` does (so each fault runs inside that node's cgroups). Faults are one at a
time: with two virtual nodes at most one may be cordoned (`max_cordoned_fraction`), so the next
fault waits until every node is Healthy again.

Reports per fault: whether its node was made Suspect and Cordoned and after how long, which
jobs ran there when it was cordoned, whether they moved (a later attempt) and finished; every
cordon no fault explains (false); every job that failed. Goals (issue 17): >= 90 % of faults
cordoned within 60 s, 0 false cordons, no job lost.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from sluice.agent.faults import FaultKind
from sluice.engine.base import FaultInjector
from sluice.health.monitor import HealthMonitor
from sluice.model import NodeHealth, Phase

CORDON_GOAL_S = 60.0
"""A fault counts as caught when its node is cordoned within this many seconds of its start."""
EXPLAINED_AFTER_S = 60.0
"""A cordon up to this long after a fault on that node ended is still the fault's."""


@dataclass
class FaultRecord:
    """One injected fault and what the loop made of it (times in seconds after its start)."""

    n: int
    kind: str
    node: str
    at_s: float
    """Seconds into the run when it was injected."""
    seconds: float
    started: float = 0.0
    """Wall-clock start (time.time)."""
    suspect_after_s: float | None = None
    cordon_after_s: float | None = None
    jobs_at_cordon: dict[str, int] = field(default_factory=dict)
    """Jobs running on the node when it was cordoned, with their attempt then."""
    moved: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    reason: str = ""

    @property
    def caught(self) -> bool:
        return self.cordon_after_s is not None and self.cordon_after_s <= CORDON_GOAL_S


@dataclass
class CampaignResult:
    minutes: float
    seed: int
    faults: list[FaultRecord]
    false_cordons: list[dict[str, Any]]
    jobs: int
    failed_jobs: list[str]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]

    @property
    def caught_share(self) -> float:
        return sum(f.caught for f in self.faults) / len(self.faults) if self.faults else 0.0

    def goals(self) -> dict[str, bool]:
        return {
            f">= 90% of faults cordoned within {CORDON_GOAL_S:g}s": bool(self.faults) and self.caught_share >= 0.9,
            "0 false cordons": not self.false_cordons,
            "no job lost": not self.failed_jobs,
        }


class _Campaign:
    """The per-tick driver: learning, then quiet gap → fault → recovery, again and again."""

    def __init__(
        self,
        mon: HealthMonitor,
        seed: int,
        fault_s: float,
        gap_s: tuple[float, float],
        memory_mb: int,
        console: Console,
        t0: float,
        end: float = float("inf"),
    ) -> None:
        self.mon, self.fault_s, self.gap_s, self.memory_mb = mon, fault_s, gap_s, memory_mb
        self.rng = random.Random(seed)
        self.console, self.t0 = console, t0
        self.end = end
        """time.monotonic() when the campaign stops: no fault starts that could not run its
        whole length before then (seed 7's 30-minute run started one 2 s before its end and
        counted it as missed)."""
        self.kinds: list[FaultKind] = []
        self.faults: list[FaultRecord] = []
        self.current: FaultRecord | None = None
        self.next_at: float | None = None
        self.seen_jobs: set[str] = set()
        self.shown = 0
        self.trace: Path | None = None

    def _kind(self) -> FaultKind:
        """Every kind once per cycle, in a fresh random order each cycle."""
        if not self.kinds:
            self.kinds = list(FaultKind)
            self.rng.shuffle(self.kinds)
        return self.kinds.pop()

    def log(self, text: str) -> None:
        self.console.print(f"[{time.monotonic() - self.t0:6.0f}s] {text}", markup=False)

    def trace_row(self) -> dict[str, Any]:
        """Each node's monitor state and newest judged KPIs this tick (for `<out>.trace.jsonl`)."""
        row: dict[str, Any] = {"t": round(time.monotonic() - self.t0, 1), "fault": self.current and self.current.n}
        for node, tr in self.mon.nodes.items():
            st = self.mon.status()[node]
            latest = dict(zip(tr.keys or [], (float(v) for v in tr.rows[-1]), strict=False)) if tr.rows else {}
            row[node] = {
                **{k: st[k] for k in ("health", "score", "threshold", "alarms", "held", "fits", "trained_on")},
                # Seconds of scheduling-change grace left after the newest sample, so that
                # `sluice bench health --replay` can hold the alarms the live monitor held.
                "grace_s": round(max(0.0, tr.grace_until - tr.last_time), 1),
                "kpis": {k: round(v, 2) for k, v in latest.items() if k.startswith(("node_", "peer_"))},
            }
        return row

    def tick(self, plane: Any, jobs: list[Any], *_: object) -> None:
        self.seen_jobs.update(j.id for j in jobs)
        if self.trace is not None:
            with self.trace.open("a") as f:
                f.write(json.dumps(self.trace_row(), default=str) + "\n")
        for t in self.mon.transitions[self.shown :]:
            self.log(f"{t.node}: {t.old} -> {t.new}: {t.reason}")
            self.shown += 1
        status = self.mon.status()
        if len(status) < len(plane.controller.view().nodes) or not all(s["model"] for s in status.values()):
            return  # still learning
        now = time.time()
        cur = self.current
        if cur is not None:
            self._follow(plane, cur, now)
            if now - cur.started < cur.seconds:
                return
            self.log(f"fault {cur.n} ({cur.kind} on {cur.node}) ended")
            self.current = None
        healthy = [n for n, s in status.items() if s["health"] == str(NodeHealth.HEALTHY)]
        if len(healthy) < len(status):
            self.next_at = None  # wait for every node to be back in service
            return
        if self.next_at is None:
            self.next_at = now + self.rng.uniform(*self.gap_s)
            return
        if now < self.next_at or time.monotonic() + self.fault_s > self.end:
            return
        self.next_at = None
        kind, node = self._kind(), self.rng.choice(sorted(healthy))
        rec = FaultRecord(len(self.faults) + 1, str(kind), node, time.monotonic() - self.t0, self.fault_s)
        workers = 2 if kind is FaultKind.IO else None
        report = plane.engine.inject_fault(node, str(kind), self.fault_s, workers, self.memory_mb)
        rec.started = time.time()
        self.faults.append(rec)
        self.current = rec
        self.log(f"fault {rec.n}: {kind} on {node} for {self.fault_s:g}s (pids {report.pids})")

    def _follow(self, plane: Any, rec: FaultRecord, now: float) -> None:
        """Note when the fault's node went Suspect and Cordoned, and which jobs ran there."""
        for t in self.mon.transitions:
            if t.node != rec.node or t.time < rec.started:
                continue
            if t.new == NodeHealth.SUSPECT and rec.suspect_after_s is None:
                rec.suspect_after_s = t.time - rec.started
            if t.new == NodeHealth.CORDONED and rec.cordon_after_s is None:
                rec.cordon_after_s = t.time - rec.started
                rec.reason = t.reason
        if rec.cordon_after_s is not None and not rec.jobs_at_cordon:
            view = plane.controller.view()
            rec.jobs_at_cordon = {
                j.id: j.attempt
                for j in view.jobs.values()
                if j.allocation is not None and rec.node in j.allocation.nodes and j.phase.active
            }


def _outcome(plane: Any, caller: Any, camp: _Campaign) -> tuple[list[str], int]:
    """Fill in moved/finished per fault; the ids of failed jobs and how many jobs ran."""
    failed = []
    for jid in sorted(camp.seen_jobs):
        j = plane.get_job(caller, jid)
        if j.phase == Phase.FAILED:
            failed.append(f"{jid} ({j.spec.name}): {j.reason}".strip())
    for rec in camp.faults:
        for jid, attempt in rec.jobs_at_cordon.items():
            j = plane.get_job(caller, jid)
            if j.attempt > attempt:
                rec.moved.append(jid)
            if j.phase == Phase.SUCCEEDED:
                rec.finished.append(jid)
    return failed, len(camp.seen_jobs)


def _false_cordons(mon: HealthMonitor, faults: list[FaultRecord]) -> list[dict[str, Any]]:
    out = []
    for t in mon.transitions:
        if t.new != NodeHealth.CORDONED:
            continue
        explained = any(
            f.node == t.node and f.started - 1.0 <= t.time <= f.started + f.seconds + EXPLAINED_AFTER_S for f in faults
        )
        if not explained:
            out.append({"node": t.node, "time": t.time, "reason": t.reason})
    return out


def campaign(
    minutes: float,
    seed: int = 1,
    fault_s: float = 90.0,
    gap_s: tuple[float, float] = (30.0, 120.0),
    memory_mb: int = 2048,
    virtual_nodes: int = 2,
    home: Path | None = None,
    out: Path | None = None,
    record: Path | None = None,
) -> CampaignResult:
    """Run the campaign for `minutes` (learning included) and print the per-fault table; with
    `out`, also write the result there as JSON and, per tick, each node's monitor state and
    judged KPIs to `<out>.trace.jsonl` (to see why a fault was or was not caught); with
    `record`, every node's modelled KPIs as labelled `<record>/<node>.npz` (`kpi_record`)."""
    from sluice.bench.kpi_record import FaultWindow, KpiRecorder
    from sluice.bench.scenario import embedded_plane, mixed_workload, run_workload

    console = Console(soft_wrap=True)
    where = home or Path(tempfile.mkdtemp(prefix="sluice-health-campaign-"))
    t0 = time.monotonic()
    end = t0 + 60 * minutes
    load_before = os.getloadavg()
    console.print(
        f"campaign: {minutes:g} min, seed {seed}, {virtual_nodes} virtual nodes, faults of {fault_s:g}s, "
        f"load average {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, state in {where} "
        "(kept: jobs' logs, the database; remove it when done)",
        markup=False,
    )
    with embedded_plane(where, "flowcon", health_enabled=True, virtual_nodes=virtual_nodes) as plane:
        if not isinstance(plane.health, HealthMonitor):
            raise RuntimeError("the plane runs no health monitor (health_enabled)")
        engine = plane.engine
        if not isinstance(engine, FaultInjector):
            raise RuntimeError(f"the {engine.name} engine cannot inject faults")
        camp = _Campaign(plane.health, seed, fault_s, gap_s, memory_mb, console, t0, end)
        camp.trace = out.with_suffix(".trace.jsonl") if out is not None else None
        recorder = KpiRecorder() if record is not None else None
        if recorder is not None:
            plane.health.tap = recorder.add
        caller = plane.store.get_tenant("default")
        if caller is None:
            raise RuntimeError("the embedded plane has no default tenant")
        while time.monotonic() < end:
            try:
                run_workload(
                    plane,
                    mixed_workload(10.0, 0.5),
                    timeout_s=max(1.0, end - time.monotonic()),
                    on_tick=camp.tick,
                    tick_s=1.0,
                )
            except TimeoutError:
                break
        if camp.current is not None:
            engine.stop_faults(camp.current.node)
        # Jobs still running when time is up are not lost: let the ones a fault moved finish.
        moved = {jid for f in camp.faults for jid in f.jobs_at_cordon}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(not plane.get_job(caller, j).phase.terminal for j in moved):
            time.sleep(2)
        failed, njobs = _outcome(plane, caller, camp)
        result = CampaignResult(
            (time.monotonic() - t0) / 60.0,
            seed,
            camp.faults,
            _false_cordons(plane.health, camp.faults),
            njobs,
            failed,
            load_before,
            os.getloadavg(),
        )
    report(console, result)
    if recorder is not None and record is not None:
        files = recorder.write(record, [FaultWindow(f.node, f.started, f.seconds) for f in camp.faults if f.started])
        console.print(
            f"recorded {len(files)} labelled KPI trace(s) in {record}"
            + ("" if files else " (none: no fault was injected, nothing to label)"),
            markup=False,
        )
        for path in files:
            with np.load(path, allow_pickle=False) as d:
                console.print(
                    f"  {path.name}: train {d['train'].shape}, test {d['test'].shape}, "
                    f"{int(d['test_label'].sum())} faulty samples",
                    markup=False,
                )
    if out is not None:
        out.write_text(
            json.dumps(
                {**asdict(result), "caught_share": result.caught_share, "goals": result.goals()}, indent=1, default=str
            )
        )
    return result


def report(console: Console, r: CampaignResult) -> None:
    table = Table(title=f"health campaign: {len(r.faults)} faults in {r.minutes:.1f} min (seed {r.seed})")
    for col in ("#", "kind", "node", "at", "suspect after", "cordoned after", "jobs there", "moved", "finished"):
        table.add_column(col, justify="right")

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f}s"

    for f in r.faults:
        table.add_row(
            str(f.n),
            f.kind,
            f.node,
            f"{f.at_s / 60:.1f} min",
            s(f.suspect_after_s),
            s(f.cordon_after_s) if f.cordon_after_s is not None else "not cordoned",
            str(len(f.jobs_at_cordon)),
            str(len(f.moved)),
            str(len(f.finished)),
        )
    console.print(table)
    for f in r.faults:
        if f.reason:
            console.print(f"  fault {f.n} cordon reason: {f.reason}", markup=False)
    by_kind: dict[str, list[FaultRecord]] = {}
    for f in r.faults:
        by_kind.setdefault(f.kind, []).append(f)
    for kind, fs in sorted(by_kind.items()):
        console.print(f"{kind}: {sum(f.caught for f in fs)}/{len(fs)} cordoned within {CORDON_GOAL_S:g}s", markup=False)
    console.print(f"false cordons: {len(r.false_cordons)}", markup=False)
    for fc in r.false_cordons:
        console.print(f"  {fc['node']} at {time.strftime('%H:%M:%S', time.localtime(fc['time']))}: {fc['reason']}")
    console.print(f"jobs: {r.jobs}, failed: {len(r.failed_jobs)} {r.failed_jobs or ''}", markup=False)
    console.print(
        f"load average before {r.load_before[0]:.2f}, after {r.load_after[0]:.2f} {r.load_after[1]:.2f} "
        f"{r.load_after[2]:.2f} (shared machine)",
        markup=False,
    )
    for goal, ok in r.goals().items():
        console.print(f"{'met' if ok else 'NOT met'}: {goal}", markup=False)
