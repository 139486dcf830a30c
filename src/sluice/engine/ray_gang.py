"""Gangs: one job, several replica processes on (possibly) several nodes, seen as one.

The controller thinks in jobs; node agents think in processes. A job with N replicas is
launched as N agent-level jobs whose ids say which replica they are (`<job>--r<k>of<N>`,
so the gang can be rebuilt from the agents alone after a control-plane restart). This book
turns their events back into the job's events with gang semantics:

- the job has started when every replica has started (all or nothing);
- progress, usage and checkpoints come from rank 0, which is the one that reports;
- the first replica to fail takes the others down (killed, no checkpoint);
- the job has exited when every replica has exited, with the first non-zero code.

A job with one replica keeps its own id and its events pass through unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from sluice.model import (
    Event,
    JobCheckpointed,
    JobExited,
    JobProgress,
    JobStarted,
    JobUsage,
    OomKill,
)

_REPLICA = re.compile(r"^(?P<job>.+)--r(?P<k>\d+)of(?P<n>\d+)$")

Stop = tuple[str, str, int]
"""(node, replica id, attempt) of a replica process to kill."""


def replica_id(job_id: str, rank: int, world: int) -> str:
    return job_id if world == 1 else f"{job_id}--r{rank}of{world}"


def parse_replica(rid: str) -> tuple[str, int, int]:
    """replica id -> (job id, rank, world size)."""
    m = _REPLICA.match(rid)
    if m is None:
        return rid, 0, 1
    return m["job"], int(m["k"]), int(m["n"])


@dataclass
class Gang:
    job_id: str
    attempt: int
    world: int
    nodes: dict[int, str] = field(default_factory=dict)
    """rank -> node name (missing while unknown, e.g. a replica that already exited)."""
    started: set[int] = field(default_factory=set)
    exited: dict[int, int] = field(default_factory=dict)
    announced: bool = False
    closed: bool = False
    reason: str = ""
    node_lost: bool = False
    """A replica died with its node: the job resumes elsewhere without counting a failure."""
    oom: OomKill | None = None
    """The first failing replica's OOM kill, if that is how it died: the gang's exit says so."""
    retryable: bool = True
    """False when the first failing replica could never start as asked: nor can the gang."""
    cpu_s: dict[int, float] = field(default_factory=dict)
    """rank -> CPU-seconds its replica has used (its newest JobUsage): the gang's is their sum."""
    disk_mb: dict[int, float] = field(default_factory=dict)
    """rank -> MiB its replica's run folder held at its node's newest disk check: the gang's is
    their sum."""

    def running_ranks(self) -> list[int]:
        return [r for r in self.nodes if r not in self.exited]


KEEP_CLOSED = 10_000
"""Closed gangs kept (the newest): one a gang attempt, never dropped before, grew without end on
a plane that runs gangs for months. A late event of one dropped reaches the controller as one of
an attempt it no longer runs, which it ignores."""


class GangBook:
    """Replica bookkeeping of every job attempt the engine launched or adopted."""

    def __init__(self) -> None:
        self._gangs: dict[tuple[str, int], Gang] = {}
        self._closed: dict[tuple[str, int], None] = {}
        """The closed gangs' keys, oldest closed first (`KEEP_CLOSED`)."""
        self.rank0: dict[str, tuple[str, str]] = {}
        """job id -> (replica id, node) of rank 0 of its newest attempt (for logs)."""

    def open(self, job_id: str, attempt: int, nodes: list[str]) -> list[tuple[str, str]]:
        """Record a launch; returns (replica id, node) per rank."""
        world = len(nodes)
        self._gangs[(job_id, attempt)] = Gang(job_id, attempt, world, dict(enumerate(nodes)))
        self.rank0[job_id] = (replica_id(job_id, 0, world), nodes[0])
        return [(replica_id(job_id, k, world), node) for k, node in enumerate(nodes)]

    def adopt(self, rid: str, attempt: int, node: str) -> str:
        """Record a replica found running on `node` (after a restart); returns its job id."""
        job_id, rank, world = parse_replica(rid)
        gang = self._gangs.setdefault((job_id, attempt), Gang(job_id, attempt, world))
        gang.nodes[rank] = node
        gang.started.add(rank)
        gang.announced = gang.announced or len(gang.started) == world
        if rank == 0:
            self.rank0[job_id] = (rid, node)
        return job_id

    def forget(self, job_id: str) -> None:
        """The job is forgotten (retention, `sluice job delete`): its rank-0 entry goes. One a job
        ever launched, it grew without end on a plane that ran for months. Its closed gangs
        age out with the others (`KEEP_CLOSED`); looking for them here would cost a walk of
        the book per job, and a retention pass forgets thousands."""
        self.rank0.pop(job_id, None)

    def replicas(self, job_id: str, attempt: int) -> list[tuple[str, str]]:
        """(replica id, node) of the attempt's replicas that may still run."""
        gang = self._gangs.get((job_id, attempt))
        if gang is None:
            return []
        return [(replica_id(job_id, r, gang.world), gang.nodes[r]) for r in sorted(gang.running_ranks())]

    def active(self) -> list[Gang]:
        return [g for g in self._gangs.values() if not g.closed]

    def translate(self, e: Event, node: str) -> tuple[list[Event], list[Stop]]:
        """An agent's event -> the job's events, and replicas to kill as a consequence."""
        if not isinstance(e, JobStarted | JobProgress | JobUsage | JobCheckpointed | JobExited):
            return [e], []
        job_id, rank, world = parse_replica(e.job_id)
        gang = self._gangs.get((job_id, e.attempt))
        if gang is None:
            # Not launched by this engine instance (e.g. an exit seen after a restart).
            gang = self._gangs.setdefault((job_id, e.attempt), Gang(job_id, e.attempt, world))
        gang.nodes.setdefault(rank, node)
        if isinstance(e, JobStarted):
            gang.started.add(rank)
            if gang.announced or len(gang.started) < gang.world:
                return [], []
            gang.announced = True
            return [JobStarted(job_id, e.attempt, gang.nodes.get(0, node), e.time, e.pid if rank == 0 else None)], []
        if isinstance(e, JobExited):
            return self._exited(
                gang, rank, e.exit_code, e.reason, e.time, node_lost=e.node_lost, oom=e.oom, retryable=e.retryable
            )
        if isinstance(e, JobUsage) and (e.cpu_s is not None or e.disk_mb is not None):
            if e.cpu_s is not None:
                gang.cpu_s[rank] = max(e.cpu_s, gang.cpu_s.get(rank, 0.0))
            if e.disk_mb is not None:
                gang.disk_mb[rank] = e.disk_mb
            cpu_s = sum(gang.cpu_s.values()) if gang.cpu_s else None
            disk_mb = sum(gang.disk_mb.values()) if gang.disk_mb else None
            if rank == 0:  # its rate stays rank 0's (what the CPU policy reads); its totals are all ranks'
                e = replace(e, cpu_s=cpu_s if e.cpu_s is not None else None, disk_mb=disk_mb)
            elif 0 in gang.exited and not gang.closed:  # rank 0 reports no more: the others' go on counting
                return [replace(e, job_id=job_id, cpu_cores=0.0, memory_mb=0.0, cpu_s=cpu_s, disk_mb=disk_mb)], []
        if rank != 0 or gang.closed:
            return [], []
        return [replace(e, job_id=job_id)], []

    def node_lost(self, node: str, now: float) -> tuple[list[Event], list[Stop]]:
        """Every replica on `node` is gone: the gangs it belonged to exit as 'node lost'."""
        events: list[Event] = []
        stops: list[Stop] = []
        for gang in self.active():
            for rank in [r for r in gang.running_ranks() if gang.nodes[r] == node]:
                ev, st = self._exited(gang, rank, -9, f"node lost: {node}", now, close_now=True, node_lost=True)
                events += ev
                stops += st
        return events, stops

    def _exited(
        self,
        gang: Gang,
        rank: int,
        code: int,
        reason: str,
        now: float,
        close_now: bool = False,
        node_lost: bool = False,
        oom: OomKill | None = None,
        retryable: bool = True,
    ) -> tuple[list[Event], list[Stop]]:
        gang.node_lost = gang.node_lost or node_lost
        first_failure = code != 0 and not any(c != 0 for c in gang.exited.values())
        if first_failure:
            gang.oom = oom
            gang.retryable = retryable
        gang.exited[rank] = code
        stops: list[Stop] = []
        if first_failure and gang.world > 1:
            gang.reason = reason or f"replica {rank} exited with code {code}"
            stops = [
                (gang.nodes[r], replica_id(gang.job_id, r, gang.world), gang.attempt) for r in gang.running_ranks()
            ]
        done = len(gang.exited) >= gang.world or close_now
        if gang.closed or not done:
            return [], stops
        gang.closed = True
        self._closed[(gang.job_id, gang.attempt)] = None
        while len(self._closed) > KEEP_CLOSED:  # in the engine's poll, as every change of the book
            oldest = next(iter(self._closed))
            del self._closed[oldest]
            self._gangs.pop(oldest, None)
        failed = [c for c in gang.exited.values() if c != 0]
        exit_code = failed[0] if failed else 0
        why = reason if close_now else (gang.reason if failed and gang.world > 1 else reason)
        return [
            JobExited(
                gang.job_id,
                gang.attempt,
                now,
                exit_code,
                why,
                node_lost=gang.node_lost,
                oom=gang.oom,
                retryable=gang.retryable,
            )
        ], stops
