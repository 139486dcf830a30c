"""`report()`: one JSON line per call, appended to the attempt's progress.jsonl.

One `write` of one whole line on an O_APPEND file: the agent tailing it never sees a torn
record (it also ignores a last line without its newline).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

from sluice.sdk._env import context
from sluice.sdk._threads import maybe_sync_threads


def _clean(v: Any) -> float | None:
    """JSON has no NaN/inf; a diverged loss is reported as null rather than breaking the line."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def append_record(record: dict[str, Any]) -> None:
    run_dir = context().run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(run_dir / "progress.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def report(step: int, loss: float | None = None, **metrics: float) -> None:
    """Record training progress at `step`. Pass `total_steps=N` so remaining time can be predicted;
    any other numeric metric (accuracy, samples_per_s, ...) is kept too; a job reading a
    `sluice.sdk.dataset` also gets `stall_s` (seconds spent waiting for data) added.

    Also where the job's thread pool follows its CPU allocation (`sdk._threads`): at most
    every few seconds, the CPU budget is re-read and torch's pool resized if it changed."""
    data = sys.modules.get("sluice.sdk.dataset")  # only when the job opened a dataset: no import here
    if data is not None:
        metrics = {**data.data_metrics(), **metrics}
    clean = {k: c for k, v in metrics.items() if (c := _clean(v)) is not None}
    append_record(
        {"t": time.time(), "step": int(step), "loss": None if loss is None else _clean(loss), "metrics": clean}
    )
    maybe_sync_threads()
