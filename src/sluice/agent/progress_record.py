"""A job's progress record, read from the `progress.jsonl` its own uid writes: untrusted input.

The SDK writes clean records (`sdk._progress`), but the file belongs to the job, which can
write anything into it. Every record becomes a plain event here or is dropped: a step is an
integer in [0, MAX_STEP] (a larger one does not fit the store's 64-bit column, and one such
record used to fail the control plane's every round), times and numbers are finite, a
record holds a bounded number of metrics with bounded names, a checkpoint path is a bounded
string. What the job writes can mislead only the job's own scheduling.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from sluice.model import Event, JobCheckpointed, JobProgress
from sluice.model.progress import MAX_STEP

MAX_METRICS = 256
"""Most metrics one record keeps (a job reading many datasets reports three counters each)."""
MAX_METRIC_NAME = 256
MAX_CHECKPOINT_PATH = 4096
MAX_PER_POLL = 100
"""Most progress events one job's records become per poll (about a second), and as many
checkpoint events: the SDK writes a few a second, but a job may flood its file (the agent
reads up to 4 MiB of it per poll), and every event costs the control plane's round, which
every tenant shares."""


def finite(v: Any) -> float | None:
    """A finite number (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int past float's range
        return None
    return f if math.isfinite(f) else None


def step_of(v: Any) -> int | None:
    """A step: an integer (or an integral float) in [0, MAX_STEP], else None."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v if 0 <= v <= MAX_STEP else None
    f = finite(v)
    if f is None or not f.is_integer() or not 0 <= f <= MAX_STEP:
        return None
    return int(f)


def progress_event(
    job_id: str, attempt: int, rec: dict[str, Any], clock: Callable[[], float]
) -> JobProgress | JobCheckpointed | None:
    """The event one record stands for, or None when the record is not one a job may send."""
    t = finite(rec.get("t"))
    if t is None:
        t = clock()
    step = step_of(rec.get("step", 0))
    if step is None:
        return None
    if "checkpoint" in rec:
        path = rec["checkpoint"]
        if not isinstance(path, str) or not path or len(path) > MAX_CHECKPOINT_PATH:
            return None
        return JobCheckpointed(job_id, attempt, t, step, path)
    raw = rec.get("metrics")
    metrics: dict[str, float] = {}
    if isinstance(raw, dict):
        for k, v in raw.items():
            if len(metrics) >= MAX_METRICS:
                break
            f = finite(v)
            if f is not None and isinstance(k, str) and 0 < len(k) <= MAX_METRIC_NAME:
                metrics[k] = f
    return JobProgress(job_id, attempt, t, step, finite(rec.get("loss")), metrics)


def thin(events: list[Event]) -> list[Event]:
    """At most MAX_PER_POLL progress and MAX_PER_POLL checkpoint events, in order: the last
    of each kind always, the rest evenly spaced. Rates need a few points and the newest
    counters; nothing a scheduler reads needs every report of a flood."""
    progress = [e for e in events if isinstance(e, JobProgress)]
    checkpoints = [e for e in events if isinstance(e, JobCheckpointed)]
    if len(progress) <= MAX_PER_POLL and len(checkpoints) <= MAX_PER_POLL:
        return events
    keep = {id(e) for e in _spaced(progress) + _spaced(checkpoints)}
    return [e for e in events if id(e) in keep]


def _spaced(events: Sequence[Event]) -> list[Event]:
    n = len(events)
    if n <= MAX_PER_POLL:
        return list(events)
    return [events[round(i * (n - 1) / (MAX_PER_POLL - 1))] for i in range(MAX_PER_POLL)]
