"""Labelled KPI traces from sluice's own nodes, in the format `sluice health eval` reads.

Why: settings chosen on one public dataset (ASD) need a second, independent set to be
checked on, and the one that matters is what sluice's own nodes show under faults it knows
it injected. During `sluice bench health --campaign --record DIR` every sample each node's
health monitor models (the judged KPIs, after the monitor's `ignore`) is kept with its time;
at the end each node becomes `DIR/<node>.npz`:

- `train`: the node's samples before the first fault of the run (the healthy learning
  period: the campaign injects nothing until every node's model is fitted);
- `test`: every later sample; `test_label`: 1 while a fault injected on *that* node was
  running (its start to start + duration), 0 otherwise — faults on the other node are 0
  here, which is what "seen there and only there" asks of a detector;
- `kpis`: the KPI names (column order), `test_time`: each test sample's time (seconds).

Limits: labels are the injection interval only (effects that outlast the fault, e.g. page
cache refilling, count as false alarms), and the samples are 1 s apart, not ASD's 5 min.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class _NodeTrace:
    keys: list[str]
    times: list[float] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)


@dataclass
class FaultWindow:
    node: str
    start: float
    """Wall-clock start (time.time), as the campaign's FaultRecord.started."""
    seconds: float


class KpiRecorder:
    """Collects every modelled sample per node (`HealthMonitor.tap`), writes labelled .npz."""

    def __init__(self) -> None:
        self.nodes: dict[str, _NodeTrace] = {}

    def add(self, node: str, keys: list[str], row: np.ndarray, t: float) -> None:
        tr = self.nodes.get(node)
        if tr is None:
            tr = self.nodes[node] = _NodeTrace(list(keys))
        if list(keys) != tr.keys:
            return  # the monitor fixes a node's KPIs on its first sample; never expected
        tr.times.append(float(t))
        tr.rows.append(np.asarray(row, dtype=np.float32).copy())

    def write(self, folder: Path, faults: list[FaultWindow]) -> list[Path]:
        """One `<node>.npz` per node with at least one sample after the first fault began;
        returns the files written. Without any fault nothing can be labelled: no files."""
        if not faults:
            return []
        folder.mkdir(parents=True, exist_ok=True)
        split = min(f.start for f in faults)
        out = []
        for node, tr in sorted(self.nodes.items()):
            t = np.asarray(tr.times)
            x = np.stack(tr.rows) if tr.rows else np.zeros((0, len(tr.keys)), np.float32)
            before = t < split
            if before.sum() == 0 or (~before).sum() == 0:
                continue
            tt = t[~before]
            label = np.zeros(len(tt), dtype=np.int8)
            for f in faults:
                if f.node == node:
                    label[(tt >= f.start) & (tt <= f.start + f.seconds)] = 1
            path = folder / f"{node}.npz"
            np.savez(
                path,
                train=x[before],
                test=x[~before],
                test_label=label,
                kpis=np.asarray(tr.keys),
                test_time=tt,
            )
            out.append(path)
        return out
