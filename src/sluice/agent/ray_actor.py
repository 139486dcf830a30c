"""The node agent as a Ray actor, plus the fence that stops its jobs when its node dies.

The Ray engine pins one of these to every Ray node (node-affinity scheduling, `soft=False`)
as a detached, named actor, so it — and the job processes it started — outlive the control
plane. It is a thin shell: all mechanism (process groups, kernel CPU limits, progress
tailing, logs, KPIs) is the same `NodeAgent` the local engine uses.

Why a fence: when Ray declares a node dead, the controller requeues that node's jobs
elsewhere. If the job processes were still running (raylet crashed, machine alive, or in
tests where every "node" shares one machine) the same job would run twice and two attempts
would write the same checkpoint directory. So each actor starts a small watcher process in
its own session that remembers the actor's descendant processes and SIGKILLs their process
groups the moment the raylet is gone. It is a separate process because the actor's worker
dies together with the raylet and could not clean up after itself.

This module imports ray lazily: the actor class is plain Python, wrapped by `ray.remote`
in the engine, so the agent layer never depends on Ray being installed.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from sluice.data.warm import WarmReport
from sluice.model import Allocation, Event, LaunchRequest, NodeInfo

FENCE_INTERVAL_S = 0.2
"""How often the fence re-reads the actor's process tree and checks the raylet (seconds)."""


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
        fence: bool = True,
    ) -> None:
        from sluice.agent.node_agent import NodeAgent
        from sluice.settings import Settings

        # The control plane's settings travel with the call: this process runs on another
        # machine whose environment knows nothing of them. The node's size is Ray's.
        size = {"node_cpus": cpu} if cpu > 0 else {}  # a head with no job CPU still gets an agent
        conf = Settings.model_validate({**(settings or {}), **size})
        self.node_name = node_name
        self.labels = {"engine": "ray", **(labels or {})}
        self._agent = NodeAgent(
            node_name,
            Path(runs_dir),
            None,
            conf,
            gpus=[str(i) for i in range(gpus)],
            memory_mb=memory_mb,
        )
        self._raylet_pid = os.getppid()
        """Ray starts workers from the raylet: a changed parent means the raylet died."""
        self._fence: subprocess.Popen[bytes] | None = start_fence(self._raylet_pid, os.getpid()) if fence else None
        self._warms: dict[str, Future[WarmReport]] = {}
        """Dataset warms under way on this node, by ticket (see warm_start)."""
        self._warm_pool: ThreadPoolExecutor | None = None

    def _node_alive(self) -> bool:
        return os.getppid() == self._raylet_pid

    def _require_node(self) -> None:
        if not self._node_alive():
            raise RuntimeError(f"node {self.node_name} is dead (its raylet is gone); not starting anything here")

    # -- the NodeAgentAPI, forwarded ------------------------------------------------------

    def info(self) -> NodeInfo:
        base = self._agent.info()
        return NodeInfo(base.name, base.cpu, base.gpus, base.memory_mb, {**base.labels, **self.labels})

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

    def log_path(self, job_id: str) -> str:
        return str(self._agent.log_path(job_id))

    # -- what only the Ray engine needs ----------------------------------------------------

    def ping(self) -> str:
        return self.node_name

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
        self, name: str, source: str, storage_options: dict[str, Any] | None = None, workers: int = 16
    ) -> str:
        """Start warming a dataset into this node's cache; returns a ticket for warm_result.

        Runs in a thread of the actor: a warm can take hours and the actor answers one call at
        a time, so a blocking call would hold up the engine's poll() of this node."""
        self._require_node()
        if self._warm_pool is None:
            self._warm_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sluice-warm")
        ticket = uuid.uuid4().hex
        self._warms[ticket] = self._warm_pool.submit(self._agent.warm_dataset, name, source, storage_options, workers)
        return ticket

    def warm_result(self, ticket: str, wait_s: float = 1.0) -> WarmReport | None:
        """The warm's report once it is done (None while it runs, waiting up to wait_s)."""
        future = self._warms.get(ticket)
        if future is None:
            raise KeyError(f"no warm {ticket} on node {self.node_name}: its agent restarted while warming")
        try:
            report = future.result(timeout=wait_s)
        except FutureTimeout:
            return None
        except Exception as err:  # a bug, not a source error (those are in the report): say so
            report = WarmReport(self.node_name, 0, 0, 0, 0.0, 0.0, f"{type(err).__name__}: {err}")
        del self._warms[ticket]
        return report

    def drop_dataset(self, name: str) -> int:
        self._require_node()
        return self._agent.drop_dataset(name)

    def fence_pid(self) -> int | None:
        return self._fence.pid if self._fence is not None else None

    def close(self) -> None:
        self._agent.close()


def start_fence(raylet_pid: int, worker_pid: int) -> subprocess.Popen[bytes]:
    """Start the watcher in its own session so it outlives this worker."""
    argv = [
        sys.executable,
        "-m",
        "sluice.agent.ray_actor",
        "fence",
        "--raylet-pid",
        str(raylet_pid),
        "--worker-pid",
        str(worker_pid),
    ]
    return subprocess.Popen(
        argv, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def run_fence(raylet_pid: int, worker_pid: int, interval_s: float = FENCE_INTERVAL_S) -> int:
    """Watch the raylet; when it is gone, SIGKILL every process group the worker started.

    Tracks the worker's descendants by (pid, create time), so a reused pid is never killed.
    Processes orphaned by an actor restart stay tracked: they are still this node's jobs.
    Exits when the raylet is gone (after killing) or when nothing is left to guard.
    """
    import psutil

    try:
        raylet = psutil.Process(raylet_pid)
        raylet_born = raylet.create_time()
    except psutil.NoSuchProcess:
        return 0
    tracked: dict[int, float] = {}
    me = os.getpid()
    worker: psutil.Process | None
    try:
        worker = psutil.Process(worker_pid)
    except psutil.NoSuchProcess:
        worker = None
    while True:
        if worker is not None:
            try:
                for child in worker.children(recursive=True):
                    if child.pid != me:
                        tracked.setdefault(child.pid, child.create_time())
            except psutil.NoSuchProcess:
                worker = None
        tracked = {pid: born for pid, born in tracked.items() if _same_process(pid, born)}
        if not _same_process(raylet_pid, raylet_born):
            # Keep fencing until the worker is gone too: it may still start something.
            _kill_all(tracked)
            if worker is None and not tracked:
                return 0
        elif worker is None and not tracked:
            return 0
        time.sleep(interval_s)


def _same_process(pid: int, born: float) -> bool:
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - born) < 0.01
    except psutil.NoSuchProcess:
        return False


def _kill_all(tracked: dict[int, float]) -> None:
    for pid, born in tracked.items():
        if not _same_process(pid, born):
            continue
        try:
            pgid = os.getpgid(pid)
            if pgid != os.getpgid(0):
                os.killpg(pgid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.agent.ray_actor")
    sub = parser.add_subparsers(dest="cmd", required=True)
    fence = sub.add_parser("fence", help="kill this node's job processes when its raylet dies")
    fence.add_argument("--raylet-pid", type=int, required=True)
    fence.add_argument("--worker-pid", type=int, required=True)
    fence.add_argument("--interval", type=float, default=FENCE_INTERVAL_S)
    args = parser.parse_args(argv)
    return run_fence(args.raylet_pid, args.worker_pid, args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
