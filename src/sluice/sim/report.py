"""Writing simulation results: per-job rows as CSV or JSON, and JCT CDF plots (PNG)."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def write_rows(rows: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """CSV or JSON by the file's suffix."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        p.write_text(json.dumps(list(rows), indent=1))
        return
    if p.suffix.lower() != ".csv":
        raise ValueError(f"--out must end in .csv or .json, got {p.name!r}")
    with p.open("w", newline="") as f:
        if not rows:
            return
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def plot_jct_cdf(series: Mapping[str, Sequence[float]], path: str | Path, title: str = "Job completion time") -> None:
    """One CDF curve per policy, JCT in hours on a log axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in series.items():
        xs = sorted(v / 3600.0 for v in values)
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("JCT (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
