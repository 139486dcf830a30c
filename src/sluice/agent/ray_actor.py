"""The node agent as a Ray actor, whose jobs do not outlive its node.

The Ray engine pins one of these to every Ray node (node-affinity scheduling, `soft=False`)
as a detached, named actor, so it — and the job processes it started — outlive the control
plane. It is a thin shell: all mechanism (process groups, kernel CPU limits, progress
tailing, logs, KPIs) is the same `NodeAgent` the local engine uses.

Why jobs are guarded: when Ray declares a node dead, the controller requeues that node's jobs
elsewhere. If the job processes were still running (raylet crashed, machine alive, or in
tests where every "node" shares one machine) the same job would run twice and two attempts
would write the same checkpoint directory. So the agent gives every job's shim the raylet as
its guard: the shim kills its job the moment the raylet is gone, and the job dies with its
shim whatever kills the shim (see `sluice.agent.shim`). An earlier design used one watcher
process per actor; Ray kills a worker's child processes when the worker exits, which
sometimes took the watcher down before it had acted, and left the jobs orphaned and running.

This module imports ray lazily: the actor class is plain Python, wrapped by `ray.remote`
in the engine, so the agent layer never depends on Ray being installed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.agent.faults import FaultReport
from sluice.agent.gpus import process_env, ray_node_gpus
from sluice.agent.netif import NET_IP_LABEL, interface_ipv4_or_none
from sluice.data.settings import CacheSettings
from sluice.data.warm import WarmReport
from sluice.model import Allocation, Event, JobUser, LaunchRequest, NodeInfo

if TYPE_CHECKING:
    from sluice.settings import Settings

log = logging.getLogger(__name__)

WARM_UNCLAIMED_S = 600.0
"""How long a warm that ended keeps its result for a plane that never comes to fetch it (s)."""


class RayNodeAgent:
    """What runs inside the per-node actor: a NodeAgent plus node facts only Ray knows."""

    def __init__(
        self,
        node_name: str,
        cpu: float,
        runs_dir: str,
        *,
        gpus: int = 0,
        memory_mb: int | None = None,
        labels: dict[str, str] | None = None,
        settings: dict[str, Any] | None = None,
        cache: dict[str, Any] | None = None,
    ) -> None:
        """`gpus`: how many GPUs Ray counts on the node; the ids handed out are the ones Ray maps
        them to (`sluice.agent.gpus.ray_node_gpus`), not 0..gpus-1. `cache`: the plane's
        node-cache settings (`Settings.cache`, folders derived from its home); SLUICE_CACHE_*
        variables in this raylet's environment win over them, field by field. Warm, rm, the
        cache reports and every job that reads datasets use the result."""
        from sluice.agent.node_agent import NodeAgent
        from sluice.settings import Settings

        # The control plane's settings travel with the call: this process runs on another
        # machine whose environment knows nothing of them. The node's size is Ray's.
        size = {"node_cpus": cpu} if cpu > 0 else {}  # a head with no job CPU still gets an agent
        self._created_with = {"runs_dir": runs_dir, "settings": settings or {}, "cache": cache or {}}
        """What the plane that created this detached actor gave it: a later plane that finds it
        by name compares its own, since an actor keeps its constructor's (RayEngine._agent_for
        reads it with Ray's `__ray_call__`, which an agent without it also answers)."""
        conf = Settings.model_validate({**(settings or {}), **size})
        self.node_name = node_name
        self.labels = {"engine": "ray", **(labels or {})}
        self._net_interface = conf.net_interface
        self._raylet_pid = os.getppid()
        """Ray starts workers from the raylet: a changed parent means the raylet died."""
        found = self.gpu_discovery = ray_node_gpus(gpus, self._raylet_env() if gpus > 0 else {})
        (log.warning if found.left_out else log.info)("node %s: %s", node_name, found.summary())
        self._agent = NodeAgent(
            node_name,
            Path(runs_dir),
            None,
            conf,
            gpus=found.ids,
            memory_mb=memory_mb,
            guard_pid=self._raylet_pid,
            cache=node_cache(cache, conf),
        )
        self._warms: dict[str, Future[WarmReport]] = {}
        """Dataset warms under way on this node, by ticket (see warm_start)."""
        self._warm_done: dict[str, float] = {}
        """When each warm in `_warms` ended (monotonic s): one whose result nobody fetched (the
        plane died while it waited) is dropped WARM_UNCLAIMED_S later."""

    def _raylet_env(self) -> Mapping[str, str]:
        """The raylet's environment, whose CUDA_VISIBLE_DEVICES maps Ray's GPUs of this node to
        real ones. This actor holds no GPU of Ray's (num_gpus=0: Ray's other work may use the
        node's GPUs it does not run), so its own CUDA_VISIBLE_DEVICES may have been emptied by
        Ray; read from /proc, the raylet's is the one it was started with."""
        env = process_env(self._raylet_pid)
        if env is None:
            log.warning(
                "node %s: cannot read the raylet's environment (/proc/%d/environ); going by this "
                "worker's CUDA_VISIBLE_DEVICES, which Ray may have emptied",
                self.node_name, self._raylet_pid,
            )  # fmt: skip
            return os.environ
        return env

    def _node_alive(self) -> bool:
        return os.getppid() == self._raylet_pid

    def _require_node(self) -> None:
        if not self._node_alive():
            raise RuntimeError(f"node {self.node_name} is dead (its raylet is gone); not starting anything here")

    # -- the NodeAgent's calls, forwarded ----------------------------------------------------

    def info(self) -> NodeInfo:
        base = self._agent.info()
        net = {NET_IP_LABEL: interface_ipv4_or_none(self._net_interface)} if self._net_interface else {}
        return NodeInfo(base.name, base.cpu, base.gpus, base.memory_mb, {**base.labels, **self.labels, **net})

    def launch(self, req: LaunchRequest) -> None:
        self._require_node()
        self._agent.launch(req)

    def resize(self, job_id: str, attempt: int, allocation: Allocation) -> None:
        self._agent.resize(job_id, attempt, allocation)

    def stop(self, job_id: str, attempt: int, checkpoint: bool = True) -> None:
        self._agent.stop(job_id, attempt, checkpoint)

    def poll(self) -> list[Event]:
        # On a node whose raylet died, jobs are being killed by the fence: those are node
        # losses, which the engine reports from Ray's membership, not crashes of the jobs.
        self._require_node()
        return self._agent.poll()

    def alive(self) -> dict[str, int]:
        return self._agent.alive()

    def unfinished(self) -> list[str]:
        return self._agent.unfinished()

    def log_path(self, job_id: str) -> str:
        return str(self._agent.log_path(job_id))

    # -- what only the Ray engine needs ----------------------------------------------------

    def address(self) -> str:
        """The node's IP as Ray knows it: what other replicas of a gang connect to."""
        import ray

        return str(ray.util.get_node_ip_address())

    def free_port(self) -> int:
        """A TCP port free on this node now, for a gang's rendezvous (MASTER_PORT)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def warm_start(
        self,
        name: str,
        source: str,
        storage_options: dict[str, Any] | None = None,
        workers: int = 16,
        generation: str = "",
        run_as: JobUser | None = None,
    ) -> str:
        """Start warming a dataset into this node's cache; returns a ticket for warm_result.

        Runs in a thread of the actor: a warm can take hours and the actor answers one call at
        a time, so a blocking call would hold up the engine's poll() of this node. A thread of
        its own, never a place in a pool: a fixed pool shared by every tenant let two tenants'
        slow sources hold every thread and every other tenant's warm wait behind them. How
        many warms run at once is the plane's bound (dataset_source_ops, per tenant
        dataset_source_ops_per_tenant)."""
        self._require_node()
        self._drop_unclaimed()
        ticket = uuid.uuid4().hex
        future: Future[WarmReport] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self._agent.warm_dataset(name, source, storage_options, workers, generation, run_as))
            except BaseException as err:  # warm_result reports it as this node's error
                future.set_exception(err)
            finally:
                self._warm_done[ticket] = time.monotonic()

        self._warms[ticket] = future
        threading.Thread(target=run, name=f"sluice-warm-{ticket[:8]}", daemon=True).start()
        return ticket

    def warm_result(self, ticket: str, wait_s: float = 1.0) -> WarmReport | None:
        """The warm's report once it is done (None while it runs, waiting up to wait_s)."""
        future = self._warms.get(ticket)
        if future is None:
            raise KeyError(
                f"no warm {ticket} on node {self.node_name}: its agent restarted while warming, or its result "
                f"went unclaimed for {WARM_UNCLAIMED_S:g} s"
            )
        try:
            report = future.result(timeout=wait_s)
        except FutureTimeout:
            return None
        except Exception as err:  # a bug, not a source error (those are in the report): say so
            report = WarmReport(self.node_name, 0, 0, 0, 0.0, 0.0, f"{type(err).__name__}: {err}")
        del self._warms[ticket]
        self._warm_done.pop(ticket, None)
        return report

    def _drop_unclaimed(self) -> None:
        """Forget warms that ended WARM_UNCLAIMED_S ago with nobody asking for their result:
        a plane that died mid-warm never fetches it, and the actor lives on."""
        now = time.monotonic()
        for ticket, ended in list(self._warm_done.items()):
            if now - ended > WARM_UNCLAIMED_S:
                self._warms.pop(ticket, None)
                self._warm_done.pop(ticket, None)

    def drop_dataset(self, name: str, owner: JobUser | None = None) -> int:
        self._require_node()
        return self._agent.drop_dataset(name, owner)

    def inject_fault(self, kind: str, seconds: float, workers: int | None = None, memory_mb: int = 512) -> FaultReport:
        self._require_node()
        return self._agent.inject_fault(kind, seconds, workers, memory_mb)

    def stop_faults(self) -> int:
        return self._agent.stop_faults()

    def close(self) -> None:
        self._agent.close()


def node_cache(plane: dict[str, Any] | None, conf: Settings) -> CacheSettings:
    """This node's cache settings: the plane's (carried from the engine), overridden field by
    field by the SLUICE_CACHE_* variables of the raylet's environment. Without the plane's
    (an agent created by an older engine), this process's own home's cache."""
    if not plane:
        return conf.cache
    here = CacheSettings()  # the raylet's environment
    return CacheSettings(**{**plane, **here.model_dump(include=here.model_fields_set)})
