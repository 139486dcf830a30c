"""LocalEngine: this machine as one node, or split into `virtual_nodes` cpuset slices.

Each (virtual) node is a NodeAgent in this process; all of them share one runs directory, so
a job's log stays one file when it migrates between virtual nodes. Job processes run under
detached shims and outlive the engine: a new LocalEngine on the same SLUICE_HOME adopts them.

A request that can never work (missing workdir, unknown program) does not raise into the
control plane: the agent reports it as JobExited with the reason, which the controller turns
into a failed attempt like any other.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sluice.agent.cgroup import detect_cgroups, split_cores, warn_once
from sluice.agent.faults import FaultReport
from sluice.agent.launchenv import LaunchError
from sluice.agent.node_agent import NodeAgent, default_node_name
from sluice.data.warm import WarmReport
from sluice.engine.base import pick_nodes
from sluice.model import Allocation, EngineCapabilities, Event, JobExited, LaunchRequest, NodeInfo
from sluice.settings import Settings

log = logging.getLogger(__name__)


def visible_gpus(env: dict[str, str] | None = None) -> list[str]:
    """GPU ids this process may hand out: CUDA_VISIBLE_DEVICES when set, none otherwise."""
    raw = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES", "")
    return [g.strip() for g in raw.split(",") if g.strip() and g.strip() != "-1"]


class LocalEngine:
    name = "local"
    capabilities = EngineCapabilities(
        live_cpu_resize=True,  # cgroup quota, or CPU affinity where no cgroup is writable
        migration=True,  # between virtual nodes, through the job's checkpoint
        node_kpis=True,
        job_progress=True,
        measured_throughput=True,
    )
    """One process per job: no gangs (multi-replica jobs are refused), no live GPU changes.
    memory_limits is decided per machine in __init__ (a cgroup memory controller or not)."""
    checkpoint_root: str | None = None  # every virtual node shares this machine's disk

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        n = self.settings.virtual_nodes
        slices = split_cores(n)
        layout = detect_cgroups(root=self.settings.cgroup_root, cpuset=n > 1)
        warn_once(layout)
        # memory_mb is enforced only where this machine has a memory controller: say so, so
        # the plane refuses such jobs at submit instead of running them unlimited.
        self.capabilities = replace(LocalEngine.capabilities, memory_limits=layout.memory_kind is not None)
        gpus = visible_gpus()
        names = [f"node-{i}" for i in range(n)] if n > 1 else [default_node_name()]
        self.agents: dict[str, NodeAgent] = {}
        for i, (node, cores) in enumerate(zip(names, slices, strict=True)):
            self.agents[node] = NodeAgent(
                node,
                self.settings.runs_dir,
                cores,
                self.settings,
                layout=layout,
                gpus=gpus[i::n],
                labels={"engine": "local"},
            )
        self._extra: list[Event] = []

    def clock(self) -> float:
        return time.time()

    def nodes(self) -> list[NodeInfo]:
        return [a.info() for a in self.agents.values()]

    def _agent_of(self, job_id: str, attempt: int) -> NodeAgent | None:
        for agent in self.agents.values():
            if agent.controller(job_id, attempt) is not None:
                return agent
        return None

    def launch(self, req: LaunchRequest) -> None:
        if req.allocation.replicas > 1:
            log.warning("local engine runs one process per job; %s asked for %d", req.job_id, req.allocation.replicas)
        agent = self.agents.get(req.allocation.primary_node)
        if agent is None:
            self._extra.append(
                JobExited(
                    req.job_id,
                    req.attempt,
                    self.clock(),
                    127,
                    f"launch failed: no node {req.allocation.primary_node!r} (nodes: {', '.join(self.agents)})",
                )
            )
            return
        try:
            agent.launch(req)
        except LaunchError as err:
            log.info("launch of %s attempt %d refused: %s", req.job_id, req.attempt, err)

    def resize(self, job_id: str, attempt: int, allocation: Allocation) -> None:
        agent = self._agent_of(job_id, attempt)
        if agent is None:
            raise LookupError(f"attempt {attempt} of {job_id} is not running")
        agent.resize(job_id, attempt, allocation)

    def stop(self, job_id: str, attempt: int, checkpoint: bool = True) -> None:
        agent = self._agent_of(job_id, attempt)
        if agent is not None:
            agent.stop(job_id, attempt, checkpoint)

    def poll(self) -> list[Event]:
        events, self._extra = self._extra, []
        for agent in self.agents.values():
            events.extend(agent.poll())
        return events

    def alive(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for agent in self.agents.values():
            out.update(agent.alive())
        return out

    def log_path(self, job_id: str) -> str | None:
        try:
            path = Path(next(iter(self.agents.values())).log_path(job_id))
        except LaunchError:
            return None
        return str(path) if path.exists() else None

    def warm_dataset(
        self,
        name: str,
        source: str,
        storage_options: Mapping[str, Any] | None = None,
        nodes: list[str] | None = None,
        workers: int = 16,
    ) -> list[WarmReport]:
        """Warm through each named agent, one after another: virtual nodes share this
        machine's cache, so the first warms it and the others find it warm."""
        names = pick_nodes(nodes, self.agents)
        opts = dict(storage_options or {})
        return [self.agents[n].warm_dataset(name, source, opts, workers) for n in names]

    def drop_dataset(self, name: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for node, agent in self.agents.items():
            try:
                out[node] = "removed" if agent.drop_dataset(name) else "not cached"
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
