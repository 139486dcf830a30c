"""Guarantees are guarantees: an elastic CPU policy moves only what lies between a job's
`cpu.min` (what it was promised, and what admission reserved for it) and its `cpu.max`.

Every CPU policy that sets a limit passes it through `cpu_limit_within`, so no policy —
FlowCon's re-allocation, DQoES's QoE shares — ever takes a job below its requested minimum.
"""

from __future__ import annotations

from sluice.model import JobView


def cpu_limit_within(job: JobView, limit: float, node_cores: float | None = None) -> float:
    """`limit` clamped to [cpu.min, cpu.max] (cpu.max defaulting to the node's cores), to
    a thousandth of a core but never rounded below the guarantee."""
    ceiling = job.cpu_max if job.cpu_max is not None else node_cores
    if ceiling is not None:
        limit = min(limit, ceiling)
    return max(round(limit, 3), job.cpu_min)
