"""Re-fit a node's health model from a campaign trace and show the SPOT threshold it gets
(docs/benchmarks.md, "A second campaign, seed 3"):

    .venv/bin/python scripts/campaign_refit_check.py campaign12.trace.jsonl node-1 2124

Takes the node's judged KPIs from every second it was Healthy up to the given second of the
run (the monitor also drops the samples that led up to each alarm; this does not, so it keeps
a few more fault samples), fits the monitor's detector on the last `history_samples` of them,
and prints the calibration scores' quantiles and the threshold `health.monitor._spot` gives.
The model's initialisation is random: expect the quantiles to move a little between runs.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from sluice.health.detector import FlowDetector
from sluice.health.monitor import MonitorConfig, _spot


def main() -> None:
    path, node, until = sys.argv[1], sys.argv[2], float(sys.argv[3])
    keys: list[str] | None = None
    rows: list[list[float]] = []
    with open(path) as f:
        for line in f:
            tick = json.loads(line)
            state = tick.get(node)
            if not state or not state.get("kpis") or tick["t"] > until:
                continue
            keys = keys or sorted(state["kpis"])
            if state["health"] == "Healthy":
                rows.append([float(state["kpis"].get(k, 0.0)) for k in keys])
    cfg = MonitorConfig()
    data = np.asarray(rows[-cfg.history_samples :], dtype=np.float32)
    det = FlowDetector(cfg.detector)
    det.fit(data, keys or [])
    c = det.calibration
    q = np.quantile(c, [0.0, 0.5, 0.9, 0.99, 1.0]).round(1)
    print(f"{node}: {len(data)} healthy samples, {len(c)} calibration scores; min/median/p90/p99/max {q}")
    print(f"SPOT threshold at q={cfg.q:g}: {_spot(cfg.q, c).threshold:.4g}")


if __name__ == "__main__":
    main()
