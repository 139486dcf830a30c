"""LocalEngine: this machine as one node, or split into `virtual_nodes` cpuset slices.

Each (virtual) node is a NodeAgent in this process; all of them share one runs directory, so
a job's log stays one file when it migrates between virtual nodes. Job processes run under
detached shims and outlive the engine: a new LocalEngine on the same SLUICE_HOME adopts them.

A request that can never work (missing workdir, unknown program) does not raise into the
control plane: the agent reports it as JobExited with the reason, which the controller turns
into a failed attempt like any other.

Gangs (resources.replicas > 1, docs/architecture.md): replica k is launched on the virtual node of
the allocation's k-th assignment, as an agent-level job `<job>--r<k>of<N>` with a CPU cgroup
(and memory limit) of its own, sized by that assignment, and torchrun's variables
(launchenv.gang_env, MASTER_ADDR=127.0.0.1). The same GangBook as the Ray engine's turns the
replicas' events back into the job's: started when all have started, progress from rank 0,
exited once when all have exited. All or nothing: a replica that cannot start stops the
ones started before it, and the others are never started; a replica that dies stops the
rest (SIGTERM, SIGKILL after the grace period) and the job exits with its code. Every
replica writes into the job's one log, each line prefixed with its rank.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sluice.agent.cgroup import detect_cgroups, split_cores, warn_once
from sluice.agent.disk_watch import DiskWatch
from sluice.agent.faults import FaultReport
from sluice.agent.gpus import discover_gpus
from sluice.agent.launchenv import LaunchError, gang_env, sized_as_a_gang
from sluice.agent.netif import interface_ipv4
from sluice.agent.node_agent import NodeAgent, default_node_name
from sluice.data.warm import WarmReport
from sluice.engine.base import pick_nodes
from sluice.engine.ray_gang import GangBook, Stop, parse_replica
from sluice.engine.run_folders import remove_job_folders
from sluice.model import (
    Allocation,
    EngineCapabilities,
    Event,
    JobCheckpointed,
    JobExited,
    JobProgress,
    JobStarted,
    JobUsage,
    JobUser,
    LaunchRequest,
    NodeInfo,
)
from sluice.settings import Settings

log = logging.getLogger(__name__)

MASTER_ADDR = "127.0.0.1"
"""Every replica runs on this machine: the gang meets on loopback."""


def free_port() -> int:
    """A TCP port free on loopback now, for a gang's rendezvous (MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((MASTER_ADDR, 0))
        return int(s.getsockname()[1])


def _replica_event(e: Event) -> bool:
    """An event of one replica of a gang (the GangBook's to translate), not of a whole job."""
    if not isinstance(e, JobStarted | JobProgress | JobUsage | JobCheckpointed | JobExited):
        return False
    return parse_replica(e.job_id)[2] > 1


class LocalEngine:
    name = "local"
    capabilities = EngineCapabilities(
        live_cpu_resize=True,  # cgroup quota, or CPU affinity where no cgroup is writable
        migration=True,  # between virtual nodes, through the job's checkpoint
        node_kpis=True,
        job_progress=True,
        measured_throughput=True,
        gang_launch=True,  # replicas start together on their virtual nodes or not at all
        max_replicas=64,  # one machine: more processes than this only contend for its cores
    )
    """No live GPU changes. memory_limits is decided per machine in __init__ (a cgroup
    memory controller or not)."""
    checkpoint_root: str | None = None  # every virtual node shares this machine's disk

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        if self.settings.net_interface:
            # This machine is every node here: an interface it does not have would make every
            # gang job's replicas crash in gloo/NCCL ("Unable to find address for ..."), each
            # restart the same; refuse the start instead (NetInterfaceUnavailable, the reason).
            interface_ipv4(self.settings.net_interface)
        n = self.settings.virtual_nodes
        slices = split_cores(n)
        layout = detect_cgroups(root=self.settings.cgroup_root, cpuset=n > 1)
        warn_once(layout)
        # memory_mb is enforced only where this machine has a memory controller: say so, so
        # the plane refuses such jobs at submit instead of running them unlimited.
        self.capabilities = replace(LocalEngine.capabilities, memory_limits=layout.memory_kind is not None)
        found = self.gpu_discovery = discover_gpus()
        gpus = found.ids
        (log.warning if found.left_out else log.info)("%s", found.summary())
        names = [f"node-{i}" for i in range(n)] if n > 1 else [default_node_name()]
        self.agents: dict[str, NodeAgent] = {}
        # Every virtual node's jobs are on this machine's one disk: one watch judges them all,
        # so a disk short of its reserve stops one job a check, not one a node.
        self.disk_watch = DiskWatch(
            self.settings.runs_dir, None, self.settings.disk_check_s, self.settings.disk_reserve_percent
        )
        for i, (node, cores) in enumerate(zip(names, slices, strict=True)):
            self.agents[node] = NodeAgent(
                node,
                self.settings.runs_dir,
                cores,
                self.settings,
                layout=layout,
                gpus=gpus[i::n],
                labels={"engine": "local"},
                disk_watch=self.disk_watch,
            )
        self.disk_watch.start()
        self._extra: list[Event] = []
        self.gangs = GangBook()
        self._unstarted: list[tuple[Event, str]] = []
        """Exits of replicas never started (a rank before them could not start), with their
        node: the GangBook needs every rank's exit to close the gang."""

    def clock(self) -> float:
        return time.time()

    def nodes(self) -> list[NodeInfo]:
        return [a.info() for a in self.agents.values()]

    def _stop_replicas(self, stops: list[Stop], checkpoint: bool = True) -> None:
        """Stop replicas the GangBook names (the rest of a gang one replica of which died):
        SIGTERM, then SIGKILL after the grace period, like any stop."""
        for node, rid, attempt in stops:
            agent = self.agents.get(node)
            if agent is not None:
                agent.stop(rid, attempt, checkpoint)

    def _agent_of(self, job_id: str, attempt: int) -> NodeAgent | None:
        for agent in self.agents.values():
            if agent.controller(job_id, attempt) is not None:
                return agent
        return None

    def launch(self, req: LaunchRequest) -> None:
        nodes = [a.node for a in req.allocation.assignments]
        missing = [n for n in dict.fromkeys(nodes) if n not in self.agents]
        if missing:  # before any replica starts
            names = ", ".join(map(repr, missing))
            self._extra.append(
                JobExited(
                    req.job_id,
                    req.attempt,
                    self.clock(),
                    127,
                    f"launch failed: no node {names} (nodes: {', '.join(self.agents)})",
                )
            )
            return
        if len(nodes) > 1:
            self._launch_gang(req, nodes)
            return
        if sized_as_a_gang(req):  # an elastic job at one replica: a world of 1
            req = replace(req, env={**req.env, **gang_env(0, nodes, MASTER_ADDR, free_port())})
        try:
            self.agents[nodes[0]].launch(req)
        except LaunchError as err:
            log.info("launch of %s attempt %d refused: %s", req.job_id, req.attempt, err)

    def _launch_gang(self, req: LaunchRequest, nodes: list[str]) -> None:
        """Start replica k on nodes[k], in rank order. When one cannot start, its agent reports
        why (exit 127), the replicas started before it are killed at once, and the ones after
        it are never started: the job exits once, with that reason."""
        port = free_port()
        replicas = self.gangs.open(req.job_id, req.attempt, nodes)
        for rank, ((rid, node), assignment) in enumerate(zip(replicas, req.allocation.assignments, strict=True)):
            sub = replace(
                req,
                job_id=rid,
                allocation=Allocation((assignment,)),
                env={**req.env, **gang_env(rank, nodes, MASTER_ADDR, port)},
            )
            try:
                self.agents[node].launch(sub, log_job=req.job_id, prefix=f"[rank{rank}] ")
            except LaunchError as err:
                log.info("replica %d of %s attempt %d refused: %s", rank, req.job_id, req.attempt, err)
                for started, on in replicas[:rank]:
                    self.agents[on].stop(started, req.attempt, checkpoint=False)
                now = self.clock()
                why = f"not started: replica {rank} could not start"
                self._unstarted += [(JobExited(r, req.attempt, now, 127, why), on) for r, on in replicas[rank + 1 :]]
                return

    def resize(self, job_id: str, attempt: int, allocation: Allocation) -> None:
        replicas = self.gangs.replicas(job_id, attempt)
        if replicas:  # each replica's cgroup gets its own assignment's limit
            for rid, node in replicas:
                a = allocation.assignments[min(parse_replica(rid)[1], len(allocation.assignments) - 1)]
                self.agents[node].resize(rid, attempt, Allocation((a,)))
            return
        agent = self._agent_of(job_id, attempt)
        if agent is None:
            raise LookupError(f"attempt {attempt} of {job_id} is not running")
        agent.resize(job_id, attempt, allocation)

    def stop(self, job_id: str, attempt: int, checkpoint: bool = True) -> None:
        replicas = self.gangs.replicas(job_id, attempt)
        if replicas:
            self._stop_replicas([(node, rid, attempt) for rid, node in replicas], checkpoint)
            return
        agent = self._agent_of(job_id, attempt)
        if agent is not None:
            agent.stop(job_id, attempt, checkpoint)

    def poll(self) -> list[Event]:
        events, self._extra = self._extra, []
        replicas: list[tuple[Event, str]] = []
        for name, agent in self.agents.items():
            for e in agent.poll():
                if _replica_event(e):
                    replicas.append((e, name))
                else:
                    events.append(e)
        replicas, self._unstarted = replicas + self._unstarted, []
        # In the order they happened, whichever agent told first: the first failure of a gang
        # is its reason (a replica that could not start, not the others killed for it).
        for e, node in sorted(replicas, key=lambda en: en[0].time):
            out, stops = self.gangs.translate(e, node)
            events += out
            self._stop_replicas(stops)
        return events

    def alive(self) -> dict[str, int]:
        """Running jobs; a gang's replicas (adopted after a restart) are booked as its gang."""
        out: dict[str, int] = {}
        for name, agent in self.agents.items():
            for rid, attempt in agent.alive().items():
                job_id = self.gangs.adopt(rid, attempt, name) if parse_replica(rid)[2] > 1 else rid
                out[job_id] = max(attempt, out.get(job_id, 0))
        return out

    def log_path(self, job_id: str) -> str | None:
        try:
            path = Path(next(iter(self.agents.values())).log_path(job_id))
        except LaunchError:
            return None
        return str(path) if path.exists() else None

    def earlier_logs(self, job_id: str) -> list[str]:
        return []  # every attempt appends to the one log, whichever virtual node runs it

    def run_folder(self, job_id: str, rank: int = 0) -> str | None:
        """`runs/<job>`, or a gang's `runs/<job>--r<rank>of<N>` (the newest, if the gang was
        resized): every virtual node shares this machine's runs folder."""
        runs = Path(self.settings.runs_dir)
        prefix = f"{job_id}--r{int(rank)}of"
        try:
            found = [e for e in os.scandir(runs) if e.name.startswith(prefix) and parse_replica(e.name)[0] == job_id]
        except FileNotFoundError:
            return None
        dated = []
        for e in found:
            with contextlib.suppress(OSError):
                dated.append((e.stat(follow_symlinks=False).st_mtime, e.path))
        if dated:
            return max(dated)[1]
        own = runs / job_id
        return str(own) if rank == 0 and own.is_dir() and not own.is_symlink() else None

    def still_running(self, job_ids: Collection[str]) -> list[str]:
        wanted = set(job_ids)
        found = {parse_replica(rid)[0] for agent in self.agents.values() for rid in agent.unfinished()}
        return sorted(found & wanted)

    def remove_run_folders(self, job_id: str) -> int:
        """Every virtual node shares this machine's runs folder (checkpoints included)."""
        self.gangs.forget(job_id)
        return remove_job_folders(Path(self.settings.runs_dir), job_id)

    def replica_log(self, job_id: str, rank: int) -> str | None:
        return None  # every replica's lines are in the one log, prefixed [rankK]

    def warm_dataset(
        self,
        name: str,
        source: str,
        storage_options: Mapping[str, Any] | None = None,
        nodes: list[str] | None = None,
        workers: int = 16,
        generation: str = "",
        run_as: JobUser | None = None,
    ) -> list[WarmReport]:
        """Warm through each named agent, one after another: virtual nodes share this
        machine's cache, so the first warms it and the others find it warm."""
        names = pick_nodes(nodes, self.agents)
        opts = dict(storage_options or {})
        return [self.agents[n].warm_dataset(name, source, opts, workers, generation, run_as) for n in names]

    def drop_dataset(self, name: str, owner: JobUser | None = None) -> dict[str, str]:
        out: dict[str, str] = {}
        for node, agent in self.agents.items():
            try:
                out[node] = "removed" if agent.drop_dataset(name, owner) else "not cached"
            except OSError as err:
                out[node] = f"{type(err).__name__}: {err}"
        return out

    def inject_fault(
        self, node: str, kind: str, seconds: float, workers: int | None = None, memory_mb: int = 512
    ) -> FaultReport:
        return self.agents[node].inject_fault(kind, seconds, workers, memory_mb)

    def stop_faults(self, node: str) -> int:
        return self.agents[node].stop_faults()

    def close(self) -> None:
        for agent in self.agents.values():
            agent.close()
        self.disk_watch.close()
