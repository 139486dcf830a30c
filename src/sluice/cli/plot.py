"""`sluice job plot`: a job's loss, throughput and CPU over time as one image.

From what the API publishes: the progress record (each report's step and loss, the CPU the
job used; kept while the job is live) and the job's events (each placement and resize names
its allocation, so the CPU handed out is a step function of time).
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

from sluice.client import EventOut, JobOut, Progress

HOLDS_CPU = ("Starting", "Running", "Stopping")
"""Phases in which a job keeps the CPU it was placed with."""


def allocation_series(events: list[EventOut], job: JobOut) -> list[tuple[float, float, float | None]]:
    """(time, CPU requested, CPU limit or None for none) at each change: placements and
    resizes set it, leaving a running phase (queued again, stopped, ended) drops it to 0."""
    out: list[tuple[float, float, float | None]] = []
    for e in events:
        alloc = e.data.get("allocation")
        if e.kind in ("place", "resize") and isinstance(alloc, list):
            req = float(sum(a.get("cpu_request", 0.0) for a in alloc))
            limits = [a.get("cpu_limit") for a in alloc]
            out.append((e.time, req, None if None in limits else float(sum(limits))))
        elif e.kind == "phase" and out and out[-1][1] > 0 and e.data.get("to") not in HOLDS_CPU:
            out.append((e.time, 0.0, 0.0))
    if job.finished_at is not None and out and out[-1][1] > 0:
        out.append((job.finished_at, 0.0, 0.0))
    return out


def throughput_series(history: list[tuple[float, int, float | None]]) -> list[tuple[float, float]]:
    """Steps per second between consecutive reports (time at the later one)."""
    out = []
    for (t0, s0, _), (t1, s1, _) in pairwise(history):
        if t1 > t0:
            out.append((t1, (s1 - s0) / (t1 - t0)))
    return out


def plot_job(job: JobOut, progress: Progress | None, events: list[EventOut], out: Path) -> Path:
    """Write the figure to `out` (the format follows its suffix: .png, .svg, .pdf)."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt

    history = progress.report_history if progress else []
    t0 = min([t for t, *_ in history] + [e.time for e in events] + [job.submitted_at])

    def rel(t: float) -> float:
        return t - t0

    fig, (ax_loss, ax_rate, ax_cpu) = plt.subplots(3, 1, sharex=True, figsize=(9, 8))
    fig.suptitle(f"job {job.id} ({job.name}): {job.phase}")
    losses = [(rel(t), v) for t, _, v in history if v is not None]
    _line(ax_loss, losses, "loss", "no loss reported (progress is kept while the job is live)")
    rates = [(rel(t), v) for t, v in throughput_series(history)]
    _line(ax_rate, rates, "steps/s", "no throughput yet (needs two reports)")
    alloc = allocation_series(events, job)
    usage = progress.usage_history if progress else []
    end = max([t for t, *_ in history] + [t for t, _ in usage], default=None)
    if alloc and alloc[-1][1] > 0 and end is not None and end > alloc[-1][0]:
        alloc.append((end, *alloc[-1][1:]))  # still held: draw it up to the latest sample
    if alloc:
        xs = [rel(t) for t, *_ in alloc]
        ax_cpu.step(xs, [r for _, r, _ in alloc], where="post", label="CPU requested")
        if all(lim is not None for *_, lim in alloc):
            ax_cpu.step(xs, [lim for *_, lim in alloc], where="post", linestyle="--", label="CPU limit")
    used = [(rel(t), c) for t, c in usage]
    if used:
        ax_cpu.plot(*zip(*used, strict=True), label="CPU used")
    ax_cpu.set_ylabel("cores")
    ax_cpu.set_xlabel("seconds since submission" if t0 == job.submitted_at else "seconds")
    if alloc or used:
        ax_cpu.legend(loc="best")
    else:
        _empty(ax_cpu, "no CPU allocation yet")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def _line(ax: Any, points: list[tuple[float, float]], label: str, empty: str) -> None:
    ax.set_ylabel(label)
    if points:
        ax.plot(*zip(*points, strict=True), marker="." if len(points) < 50 else None)
    else:
        _empty(ax, empty)


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="grey")
