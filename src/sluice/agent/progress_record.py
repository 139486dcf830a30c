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
from collections.abc import Callable
from typing import Any

from sluice.model import JobCheckpointed, JobProgress
from sluice.model.progress import MAX_STEP

MAX_METRICS = 256
"""Most metrics one record keeps (a job reading many datasets reports three counters each)."""
MAX_METRIC_NAME = 256
MAX_CHECKPOINT_PATH = 4096


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
