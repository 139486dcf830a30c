"""Re-fit a node's health model from a campaign trace the way the live monitor kept its
healthy history, with and without the samples that scored over the threshold while the node
was Healthy (alarms held by a scheduling change's grace), and print the SPOT threshold each
gets (docs/benchmarks.md, "A third campaign, seed 4"):

    .venv/bin/python scripts/campaign_held_refit_check.py campaign13.trace.jsonl node-1 600 1100 1140

Emulates the monitor's history: samples taken while the node was Healthy, less the
`cordon_window_s + smooth` samples before each time it left Healthy; the fit takes the newest
`n` of them up to each given second. The detector is seeded; the trace's KPIs are rounded to
two decimals, so the figures are close to, not identical with, the live fit's.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np

from sluice.health.detector import FlowDetector
from sluice.health.monitor import MonitorConfig, _spot


def history(
    ticks: list[dict], node: str, until: float, skip_over: bool, drop: int
) -> tuple[list[str], list[list[float]]]:
    keys: list[str] = []
    rows: list[list[float]] = []
    prev = None
    for tick in ticks:
        st = tick.get(node)
        if not st or not st.get("kpis") or tick["t"] > until:
            continue
        keys = keys or sorted(st["kpis"])
        if prev == "Healthy" and st["health"] != "Healthy":
            del rows[-drop:]
        if st["health"] == "Healthy":
            over = not math.isnan(st["score"]) and st["score"] > st["threshold"]
            if not (skip_over and over):
                rows.append([float(st["kpis"].get(k, 0.0)) for k in keys])
        prev = st["health"]
    return keys, rows


def main() -> None:
    path, node, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(path) as f:
        ticks = [json.loads(line) for line in f if line.strip()]
    cfg = MonitorConfig()
    drop = int(cfg.rules.cordon_window_s) + cfg.detector.smooth
    for until in (float(x) for x in sys.argv[4:]):
        for skip_over in (False, True):
            keys, rows = history(ticks, node, until, skip_over, drop)
            data = np.asarray(rows[-n:], dtype=np.float32)
            det = FlowDetector(cfg.detector)
            det.fit(data, keys)
            c = det.calibration
            label = "without over-threshold samples" if skip_over else "with them (as before)      "
            print(
                f"until {until:g}s, {label}: fit on {len(data)} samples; calibration max {c.max():.1f}, "
                f"median {np.median(c):.1f}; threshold {_spot(cfg.q, c).threshold:.1f}"
            )


if __name__ == "__main__":
    main()
