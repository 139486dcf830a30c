"""Failure injection: node losses at given times or at a rate, each repaired after a while.

A lost node takes its jobs down; they lose the work done since their last checkpoint
(uniformly somewhere in the checkpoint interval) and go back to the queue. What that costs
in completion time is the measurement.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class FailurePlan:
    """at: explicit (time s, node) losses. rate_per_node_hour: random losses (Poisson).
    repair_s: seconds until a lost node comes back. checkpoint_interval_s: how often jobs
    checkpoint, which bounds the work a loss destroys."""

    at: list[tuple[float, str]] = field(default_factory=list)
    rate_per_node_hour: float = 0.0
    repair_s: float = 1800.0
    checkpoint_interval_s: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate_per_node_hour < 0 or self.repair_s < 0 or self.checkpoint_interval_s < 0:
            raise ValueError("failure rate, repair time and checkpoint interval must be non-negative")
        self._rng = random.Random(self.seed)
        self._pending = sorted(self.at)

    def losses(self, t0: float, t1: float, nodes: list[str]) -> list[tuple[float, str]]:
        """Node losses in (t0, t1], in time order."""
        out = [(t, n) for t, n in self._pending if t0 < t <= t1]
        self._pending = [(t, n) for t, n in self._pending if t > t1]
        if self.rate_per_node_hour > 0 and nodes:
            lam = self.rate_per_node_hour * len(nodes) * (t1 - t0) / 3600.0
            t = t0
            # Poisson process over the whole cluster: exponential gaps at the total rate.
            per_s = lam / (t1 - t0) if t1 > t0 else 0.0
            while per_s > 0:
                t += self._rng.expovariate(per_s)
                if t > t1:
                    break
                out.append((t, self._rng.choice(nodes)))
        out.sort()
        return out

    def lost_work_s(self) -> float:
        """Seconds of work a job loses when its node dies."""
        return self._rng.uniform(0.0, self.checkpoint_interval_s)
