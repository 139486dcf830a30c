"""`report()`: one JSON line per call, appended to the attempt's progress.jsonl.

One `write` of one whole line on an O_APPEND file: the agent tailing it never sees a torn
record (it also ignores a last line without its newline).
"""

from __future__ import annotations

import json
import math
import operator
import os
import sys
import time
from typing import Any

from sluice.sdk._env import context
from sluice.sdk._threads import maybe_sync_threads


def _clean(v: Any, name: str = "loss") -> float | None:
    """A number (anything `float()` takes: a Python or numpy number, a one-element tensor,
    detached first so that a loss that requires grad is taken without torch's warning).
    JSON has no NaN/inf: a diverged loss is reported as null rather than breaking the line.
    Anything else is the caller's mistake and raises, naming it (it was recorded as null, or
    the metric dropped, without a word)."""
    detach = getattr(v, "detach", None)
    if callable(detach):
        v = detach()  # a loss straight from the graph: float() of it warns in every job's log
    try:
        f = float(v)
    except OverflowError:  # an int past float's range: infinite, as 1e999 is
        return None
    except (TypeError, ValueError):
        raise TypeError(f"sluice.sdk.report: {name} must be a number, got {type(v).__name__} {str(v)[:40]!r}") from None
    return f if math.isfinite(f) else None


MAX_STEP = 2**53
"""The largest step and total_steps the node agent keeps (`sluice.agent.progress_record`)."""
MAX_METRICS = 256
"""Most metrics one report may carry: the agent keeps no more of a record."""
MAX_METRIC_NAME = 256
"""Longest metric name, in characters: the agent drops a longer one."""


def whole_step(step: Any, who: str = "sluice.sdk.report") -> int:
    """A whole step number in [0, MAX_STEP]: 2.9 was recorded as step 2, and the agent drops a
    record whose step is negative or past MAX_STEP without a word."""
    at: int | None = None
    if not isinstance(step, bool):
        try:
            at = operator.index(step)
        except TypeError:
            if isinstance(step, float) and step.is_integer():
                at = int(step)
    if at is None:
        raise TypeError(f"{who}: step must be a whole number, got {type(step).__name__} {str(step)[:40]!r}")
    if not 0 <= at <= MAX_STEP:
        raise ValueError(f"{who}: step {at} is out of range: a step is 0 to 2**53 ({MAX_STEP})")
    return at


def _bounded(metrics: dict[str, float], added: int = 0) -> None:
    """What the agent would cut: more than MAX_METRICS metrics, a name empty or too long.
    `added`: how many of them the SDK added (`sluice.sdk.dataset`'s), named in the refusal, so
    a job that passed 255 metrics is not told it passed 258."""
    if len(metrics) > MAX_METRICS:
        extra = (
            f" ({added} added by sluice.sdk.dataset: stall_s, data_bytes and 3 cache counters per dataset opened)"
            if added
            else ""
        )
        raise ValueError(f"sluice.sdk.report: {len(metrics)} metrics{extra}; a report carries at most {MAX_METRICS}")
    for k in metrics:
        if not 0 < len(k) <= MAX_METRIC_NAME:
            raise ValueError(
                f"sluice.sdk.report: metric name {k[:40]!r} ({len(k)} characters) must be 1 to {MAX_METRIC_NAME}"
            )


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
    """Record training progress at `step` (a whole number, 0 to 2**53). Pass `total_steps=N`
    (a whole N >= 1) so remaining time can be predicted; any other numeric metric (accuracy,
    samples_per_s, ...) is kept too, at most 256 per report, each name 1 to 256 characters;
    a job reading a `sluice.sdk.dataset` also gets `stall_s` (seconds spent waiting for data)
    added, and 3 cache counters per dataset as far as they fit under the 256 (the job's own
    metrics first). A NaN or infinite loss is recorded as null, and such a metric left out of the record;
    a value that is not a number raises TypeError naming it, a value out of those bounds
    ValueError.

    Also where the job's thread pool follows its CPU allocation (`sdk._threads`): at most
    every few seconds, the CPU budget is re-read and torch's pool resized if it changed."""
    data = sys.modules.get("sluice.sdk.dataset")  # only when the job opened a dataset: no import here
    added = 0
    if data is not None:
        own = {k: v for k, v in data.data_metrics().items() if k not in metrics}
        counters = sorted(k for k in own if k.startswith(data.CACHE_METRIC))  # 3 per dataset, grouped by name
        base = {k: v for k, v in own.items() if not k.startswith(data.CACHE_METRIC)}
        # The cache counters are the SDK's, not the job's: past the cap they are left out (whole
        # datasets' worth, by name), never the reason a report is refused. A job reading 85
        # datasets could not report at all (red team s32).
        room = max(0, MAX_METRICS - len(metrics) - len(base))
        kept = counters[: room - room % 3]
        added = len(base) + len(kept)
        metrics = {**base, **{k: own[k] for k in kept}, **metrics}
    at = whole_step(step)
    _bounded(metrics, added)
    clean = {k: c for k, v in metrics.items() if (c := _clean(v, k)) is not None}
    if "total_steps" in clean and clean["total_steps"] < 1:
        raise ValueError(f"sluice.sdk.report: total_steps must be at least 1, got {metrics['total_steps']!r}")
    if "total_steps" in clean and not (clean["total_steps"].is_integer() and clean["total_steps"] <= MAX_STEP):
        raise ValueError(
            f"sluice.sdk.report: total_steps must be a whole number up to 2**53, got {metrics['total_steps']!r}"
        )
    append_record({"t": time.time(), "step": at, "loss": None if loss is None else _clean(loss), "metrics": clean})
    maybe_sync_threads()
