"""Prometheus metrics of the control plane: jobs by phase and reconcile round durations.

Each app gets its own registry (several planes in one test process must not collide in the
global one). Job counts are read at scrape time, so they are never stale; round durations are
fed by a controller observer, which runs once per round and sees the previous round's time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.control.controller import Controller
from sluice.control.plane import ControlPlane
from sluice.model import ClusterView, Event, NodeDecision, Phase

ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _PlaneCollector(Collector):
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    def collect(self) -> Iterator[Metric]:
        phases: Counter[str] = Counter(self.plane.job_counts())
        rounds = int(self.plane.controller.rounds)
        jobs = GaugeMetricFamily("sluice_jobs", "Jobs the control plane knows, by phase.", labels=["phase"])
        for phase in Phase:
            jobs.add_metric([phase.value], phases.get(phase.value, 0))
        yield jobs
        yield CounterMetricFamily("sluice_reconcile_rounds", "Reconcile rounds run since start.", value=rounds)
        decided = CounterMetricFamily(
            "sluice_decisions",
            "Decisions executed since start, by kind (refused: the engine could not).",
            labels=["kind"],
        )
        for kind, n in sorted(dict(self.plane.controller.decisions).items()):
            decided.add_metric([kind], n)
        yield decided


def build_registry(plane: ControlPlane) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_PlaneCollector(plane))
    hist = Histogram(
        "sluice_reconcile_round_seconds",
        "Wall time of one reconcile round (poll, decide, act).",
        buckets=ROUND_BUCKETS,
        registry=registry,
    )
    plane.controller.add_observer(_RoundTimer(plane.controller, hist))
    return registry


class _RoundTimer:
    """A round observer that feeds the round-time histogram; it never asks for anything.
    Called inside round N+1, where the controller's round_seconds is round N's time."""

    def __init__(self, controller: Controller, hist: Histogram) -> None:
        self.controller = controller
        self.hist = hist
        self.seen = int(controller.rounds)

    def observe(self, view: ClusterView, events: Sequence[Event]) -> list[NodeDecision]:
        if self.controller.rounds > self.seen:
            self.seen = self.controller.rounds
            self.hist.observe(float(self.controller.round_seconds))
        return []
