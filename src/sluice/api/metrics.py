"""Prometheus metrics of the control plane: jobs by phase and reconcile round durations.

Each app gets its own registry (several planes in one test process must not collide in the
global one). Job counts are read at scrape time, so they are never stale; round durations are
fed by a controller observer, which runs once per round and sees the previous round's time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.model import Phase

ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _PlaneCollector(Collector):
    def __init__(self, plane: Any) -> None:
        self.plane = plane

    def collect(self) -> Iterator[Metric]:
        ctl = getattr(self.plane, "controller", None)
        phases: Counter[str] = Counter()
        rounds = 0
        if ctl is not None:
            with ctl.lock:
                phases.update(j.phase.value for j in ctl.jobs.values())
                rounds = int(ctl.rounds)
        jobs = GaugeMetricFamily("sluice_jobs", "Jobs the control plane knows, by phase.", labels=["phase"])
        for phase in Phase:
            jobs.add_metric([phase.value], phases.get(phase.value, 0))
        yield jobs
        yield CounterMetricFamily("sluice_reconcile_rounds", "Reconcile rounds run since start.", value=rounds)


def build_registry(plane: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_PlaneCollector(plane))
    hist = Histogram(
        "sluice_reconcile_round_seconds",
        "Wall time of one reconcile round (poll, decide, act).",
        buckets=ROUND_BUCKETS,
        registry=registry,
    )
    ctl = getattr(plane, "controller", None)
    if ctl is not None and hasattr(ctl, "observers"):
        seen = {"rounds": int(getattr(ctl, "rounds", 0))}

        def observe(controller: Any, _events: list[Any]) -> None:
            # Called inside round N+1: controller.round_seconds is round N's time.
            if controller.rounds > seen["rounds"]:
                seen["rounds"] = controller.rounds
                hist.observe(float(controller.round_seconds))

        ctl.observers.append(observe)
    return registry
