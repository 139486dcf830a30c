"""`ThroughputMeter`: the job's measured samples/s and steps/s, with the world size it ran at.

Why: whether a job should get more replicas depends on how its throughput grows with them,
and only the job sees its own steps. Pollux fits its throughput model to what jobs measure
at the sizes they have run at; sluice's plane keeps such a record per world size from these
metrics (the progress reports carry them, see docs/client.md):

    samples_per_s   samples a second over the last window, over every replica
    steps_per_s     optimizer steps a second over the last window
    world_size      replicas the job runs at (WORLD_SIZE, 1 when unset)
    global_batch    samples a step over every replica (the batch the rate was measured at)

A window runs from one `metrics()` call to the next, so each report carries the rate since
the previous one; the first window starts at the first `step()` — after the first step, so
start-up and the first step's one-off costs (allocations, the DDP bucket rebuild) are out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable


class ThroughputMeter:
    """Count steps as they end; `metrics()` gives the rates since the last call.

    meter = sdk.ThroughputMeter(global_batch=el.global_batch, world_size=el.world_size)
    for step in ...:
        train_one_step()
        meter.step()
        if step % 20 == 0:
            sdk.report(step, loss=..., **meter.metrics())
    """

    def __init__(
        self, global_batch: int, world_size: int | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if global_batch <= 0:
            raise ValueError(f"global_batch={global_batch} must be positive")
        self.global_batch = global_batch
        self.world_size = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE") or 1)
        if self.world_size <= 0:
            raise ValueError(f"world_size={self.world_size} must be positive")
        self._clock = clock
        self._t0: float | None = None
        self._steps = 0
        self._samples = 0

    def step(self, samples: int | None = None) -> None:
        """One step ended; `samples` when it was not `global_batch` (a short last batch)."""
        now = self._clock()
        if self._t0 is None:  # the first step ends the start-up: the window opens here
            self._t0 = now
            return
        self._steps += 1
        self._samples += self.global_batch if samples is None else samples

    def metrics(self) -> dict[str, float]:
        """Rates over the window since the last call (or the first step), then a new window;
        just the world size and batch while no step has been timed."""
        out = {"world_size": float(self.world_size), "global_batch": float(self.global_batch)}
        now = self._clock()
        if self._t0 is not None and self._steps > 0 and now > self._t0:
            dt = now - self._t0
            out |= {"samples_per_s": self._samples / dt, "steps_per_s": self._steps / dt}
            self._t0, self._steps, self._samples = now, 0, 0
        return out
