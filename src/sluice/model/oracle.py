"""Simulator ground truth, for upper-bound studies only.

A real engine cannot know how long a job has left or how its goodput scales before it has
run at that size: it measures what the job reports. The simulator knows both exactly,
because it computes them. Handing that to policies by default made every simulated result
an oracle result without saying so. So the ground truth travels separately, typed, and only
when asked for: `SimEngine(oracle=True)` offers an `OracleSource`, the simulation driver
passes it to the Controller explicitly (`sluice sim run --oracle`), and the results are
labelled "oracle (upper bound)". Without it `JobView.oracle` is None and policies estimate
from what a real engine observes (`JobView.progress`, the spec).

It lives in `model` because the simulator (which may import only `model`) builds it and
policies read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sluice.model.allocation import Allocation

SpeedupFn = Callable[[Allocation], float]
"""Relative goodput of a job under an allocation (1.0 = its reference allocation)."""

ORACLE_LABEL = "oracle (upper bound)"
"""How results of a run that gave policies the simulator's ground truth are labelled."""


@dataclass(frozen=True, slots=True)
class OracleInfo:
    """SIMULATOR GROUND TRUTH about one job — no real engine can supply this.

    remaining_ref_s: exact seconds of work left at the reference allocation.
    ref_gpus:        the reference allocation's GPU count (speedup 1.0 there).
    speedup:         the job's true relative goodput under any allocation.
    restart_s:       what one restart (or GPU change) costs the job, exactly.
    """

    remaining_ref_s: float
    ref_gpus: int = 1
    speedup: SpeedupFn | None = None
    restart_s: float | None = None


class OracleSource(Protocol):
    """What gives a controller ground truth: only a simulator built with `oracle=True`."""

    def oracle(self, job_id: str) -> OracleInfo | None: ...
