"""Queues and their quotas, as plain immutable values (what admission decides on).

The model is Kueue's ClusterQueue/cohort (also YARN capacity-scheduler queues): a queue has
a *nominal* quota per resource; queues in one *cohort* lend each other the part of their
nominal quota they are not using, up to each lender's `lending_limit`, and each borrower
may take at most its `borrowing_limit` above its nominal quota. A job's quota is reserved
when it is admitted (Pending -> Queued) and released when it stops holding it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Literal

RESOURCES = ("cores", "memory_mb", "gpus", "jobs")
"""The quota resources: guaranteed CPU cores (`cpu.min`), memory, GPUs, admitted jobs."""

SHARE_RESOURCES = ("cores", "memory_mb", "gpus")
"""The resources dominant-resource fairness compares (a job count is not a resource share)."""

DEFAULT_QUEUE = "default"
"""The queue every tenant is granted and every spec names unless it says otherwise. It has no
quota until an admin gives it one, so a cluster with no queues behaves as before."""

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Amounts:
    """An amount of each quota resource (a job's demand, a queue's usage)."""

    cores: float = 0.0
    memory_mb: float = 0.0
    gpus: float = 0.0
    jobs: float = 0.0

    def get(self, r: str) -> float:
        return float(getattr(self, r))

    def plus(self, o: Amounts) -> Amounts:
        return Amounts(self.cores + o.cores, self.memory_mb + o.memory_mb, self.gpus + o.gpus, self.jobs + o.jobs)

    def minus(self, o: Amounts) -> Amounts:
        return Amounts(self.cores - o.cores, self.memory_mb - o.memory_mb, self.gpus - o.gpus, self.jobs - o.jobs)


@dataclass(frozen=True, slots=True)
class Limits:
    """A limit per quota resource; None means no limit on that resource."""

    cores: float | None = None
    memory_mb: float | None = None
    gpus: float | None = None
    jobs: float | None = None

    def get(self, r: str) -> float | None:
        v = getattr(self, r)
        return None if v is None else float(v)

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @staticmethod
    def from_dict(d: dict[str, Any] | None) -> Limits:
        d = d or {}
        return Limits(**{r: (None if d.get(r) is None else float(d[r])) for r in RESOURCES})

    def describe(self) -> str:
        return ", ".join(f"{r} {fmt(v)}" for r, v in self.to_dict().items()) or "no limit"


class Reclaim(StrEnum):
    """Whether a job that fits its queue's nominal quota may preempt jobs that other queues of
    its cohort run on borrowed quota (Kueue's `reclaimWithinCohort`). With `never`, a lender
    waits until the borrowers finish: no job is ever preempted for it, and its guarantee may be
    late by as long as the borrowers run. The same setting also governs a borrowing job taking
    quota from lower-priority borrowers of other queues (`any` and `lower_priority` allow it)."""

    ANY = "any"
    LOWER_PRIORITY = "lower_priority"
    NEVER = "never"


class WithinQueue(StrEnum):
    """Whether a job may preempt lower-priority jobs of its own queue (Kueue's
    `withinClusterQueue`)."""

    LOWER_PRIORITY = "lower_priority"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """One queue: its nominal quota, cohort, borrowing and lending limits, and fair-share
    weight. `borrowing_limit` None: may borrow whatever the cohort lends; `lending_limit`
    None: lends all of its unused nominal quota."""

    name: str
    cohort: str | None = None
    nominal: Limits = field(default_factory=Limits)
    borrowing_limit: Limits = field(default_factory=Limits)
    lending_limit: Limits = field(default_factory=Limits)
    weight: float = 1.0
    reclaim_within_cohort: Reclaim = Reclaim.ANY
    within_queue: WithinQueue = WithinQueue.LOWER_PRIORITY
    max_runtime_s: float | None = None
    """Most seconds one of its jobs may run (None: no limit of the queue's own)."""

    def runtime_limit(self, own: float | None) -> RuntimeLimit | None:
        """The seconds a job of this queue asking for `own` (its `max_runtime_s`) may run: the
        smaller of its own and the queue's; None when neither sets one."""
        if own is None and self.max_runtime_s is None:
            return None
        if self.max_runtime_s is None or (own is not None and own <= self.max_runtime_s):
            return RuntimeLimit(float(own or 0.0), "job", "its max_runtime_s")
        return RuntimeLimit(self.max_runtime_s, "queue", f"queue {self.name}'s max_runtime_s")

    def lendable(self, r: str) -> float | None:
        """The part of its nominal quota of `r` this queue lends its cohort when unused."""
        nom = self.nominal.get(r)
        if nom is None:
            return None
        lend = self.lending_limit.get(r)
        return nom if lend is None or self.cohort is None else min(lend, nom)

    def guaranteed(self, r: str) -> float | None:
        """The part of its nominal quota of `r` nobody else may ever borrow."""
        nom, lend = self.nominal.get(r), self.lendable(r)
        return None if nom is None or lend is None else nom - lend


@dataclass(frozen=True, slots=True)
class RuntimeLimit:
    """How long a job may run (Starting or Running, summed over its attempts) and whose limit
    that is: a job is held to the smaller of its own `max_runtime_s` and its queue's."""

    seconds: float
    of: Literal["job", "queue"]
    """"job" or "queue": whose `max_runtime_s` it is."""
    whose: str
    """The same, said in a reason ("its max_runtime_s", "queue q's max_runtime_s")."""


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority an admin defines (Kueue's WorkloadPriorityClass, Kubernetes'
    PriorityClass): jobs name it instead of a bare integer, so the numbers stay one admin's
    decision. `preempts` False is Kubernetes' `preemptionPolicy: Never`: its jobs go ahead of
    lower priorities in line but never preempt them. `default`: applied to jobs that set
    neither `priority` nor `priority_class` (at most one class is the default)."""

    name: str
    value: int
    description: str = ""
    preempts: bool = True
    default: bool = False
    created_at: float = 0.0


def fmt(x: float) -> str:
    """A quota number as people write it (8, 2.5, 16384)."""
    return f"{round(x, 3):g}"


__all__ = [
    "DEFAULT_QUEUE",
    "RESOURCES",
    "SHARE_RESOURCES",
    "Amounts",
    "Limits",
    "PriorityClass",
    "QueueConfig",
    "Reclaim",
    "WithinQueue",
    "fmt",
]
