"""The Engine protocol: the seam between the controller and the machines.

Every call is asynchronous in effect: `launch` and `stop` return at once and their outcome
(JobStarted, JobExited, ...) arrives later from `poll()`. Jobs are addressed by
(job_id, attempt) so an event from an older attempt can be told apart and ignored.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from sluice.agent.faults import FaultReport
from sluice.data.warm import WarmReport
from sluice.model import Allocation, EngineCapabilities, Event
from sluice.model.launch import JobUser, LaunchRequest, NodeInfo


class EngineTaken(RuntimeError):
    """Another control plane took what this plane's engine acts through (on Ray: the
    namespace's claim, after the record was lost with its node and the other plane started in
    the gap). Raised from `poll`: two planes driving one set of agents would each take the
    other's running jobs for gone and run them again, so this one stops acting, as a plane
    whose database another took does (`StoreInUse`)."""


@runtime_checkable
class Engine(Protocol):
    name: str
    capabilities: EngineCapabilities
    """What this engine can carry out and observe; the controller refuses decisions outside it."""
    checkpoint_root: str | None
    """Where checkpoints go when every node must reach them (a shared mount on Ray); None:
    the control plane's own runs folder, which is right when all nodes share its disk."""

    def nodes(self) -> list[NodeInfo]:
        """Nodes that exist now."""
        ...

    def launch(self, req: LaunchRequest) -> None:
        """Start the job's processes; JobStarted (or JobExited) follows from poll()."""
        ...

    def resize(self, job_id: str, attempt: int, allocation: Allocation) -> None:
        """Apply new resource limits to a running job in place (same processes)."""
        ...

    def stop(self, job_id: str, attempt: int, checkpoint: bool = True) -> None:
        """SIGTERM (the job checkpoints and exits), SIGKILL after the grace period.
        With checkpoint=False the job is killed at once. JobExited follows from poll()."""
        ...

    def poll(self) -> list[Event]:
        """Events since the last poll: progress, usage, checkpoints, exits, node changes, KPIs."""
        ...

    def clock(self) -> float:
        """Seconds: wall clock for real engines, virtual time for the simulator."""
        ...

    def alive(self) -> dict[str, int]:
        """job_id -> attempt of every job process that is running now (used to adopt jobs
        after a control-plane restart)."""
        ...

    def log_path(self, job_id: str) -> str | None:
        """Where the job's log can be read from the control plane, if anywhere: the one its
        current (or newest) attempt writes."""
        ...

    def replica_log(self, job_id: str, rank: int) -> str | None:
        """The log of one replica of the job's newest attempt, on an engine that keeps one per
        replica (Ray: each on its node); None on one that writes every replica into the job's
        one log, each line prefixed `[rankK]` (local)."""
        ...

    def earlier_logs(self, job_id: str) -> list[str]:
        """The logs of the job's earlier attempts that `log_path` does not hold, oldest first:
        an engine that writes one log per node (Ray) leaves a moved job's first attempts on
        the nodes they ran on. [] where one log holds every attempt (local)."""
        ...

    def close(self) -> None:
        """Release the engine's own resources. Job processes are left running."""
        ...


@runtime_checkable
class CacheWarmer(Protocol):
    """An engine whose nodes each run an agent holding a dataset cache: it can fill the cache of
    every node (or some) before jobs read from it. Optional: an engine without node caches (the
    simulator) does not implement it."""

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
        """Warm the dataset on `nodes` (None: every node) through each node's agent, all nodes
        at once; returns when every node is done, one report per node. An unknown node name
        raises ValueError before anything starts. `generation`: which registration of the
        dataset (part of its cache folder, as its jobs open it); `run_as`: under isolation,
        the tenant uid whose own cache its jobs read, which is the one filled (None: the
        node's shared cache)."""
        ...

    def drop_dataset(self, name: str, owner: JobUser | None = None) -> dict[str, str]:
        """Remove every cached copy of the dataset from every node's cache (`sluice dataset rm`):
        every source and generation, the shared cache and every tenant uid's own; per node,
        what happened ("removed", "not cached" or the error), so one unreachable node does not
        hide what the others did. `owner`: under isolation, the owner's uid, whose cache is
        emptied before this answers; other tenants' copies go in the background
        (`sluice.agent.tenant_cache.drop_everywhere`)."""
        ...


@runtime_checkable
class RunFolders(Protocol):
    """An engine that keeps each job's run folder where the control plane can reach it (this
    machine, or a mount every node shares): it can hand out a job's files (`sluice job
    files`) and remove a forgotten job's folders (job retention, `sluice job delete`).
    Optional: the simulator keeps none."""

    def run_folder(self, job_id: str, rank: int = 0) -> str | None:
        """The run folder of replica `rank` of the job's newest attempt (a job of one replica:
        its own), where its `work/` (HOME), `tmp/` and default checkpoints are; None when it
        has none (never started)."""
        ...

    def still_running(self, job_ids: Collection[str]) -> list[str]:
        """Those of `job_ids` with an attempt (any replica) that a node the engine reaches has
        not finished: processes running, or leftovers not yet killed. A job ends in the book
        before that where sluice ends it itself (an internal error, a lost node): its folders
        must not be removed under them, since what they write then to files unlinked would
        count against no one."""
        ...

    def remove_run_folders(self, job_id: str) -> int:
        """Remove the ended job's run folders (its log, its attempts' files, the checkpoints
        kept there; its replicas' on every node) and any checkpoint folder of it under the
        engine's checkpoint root; how many folders went. Checkpoints under an admin's
        `checkpoint_roots` are left."""
        ...


@runtime_checkable
class FaultInjector(Protocol):
    """An engine whose node agents can make their node sick on purpose (`sluice node fault`):
    how operators test that the health loop cordons a sick node and moves its jobs. Optional:
    the simulator injects failures its own way."""

    def inject_fault(
        self, node: str, kind: str, seconds: float, workers: int | None = None, memory_mb: int = 512
    ) -> FaultReport:
        """Start a `kind` fault (cpu, memory, io, net) pinned to the node's cores, stopped after
        `seconds`. KeyError for an unknown node, ValueError for a bad kind or duration."""
        ...

    def stop_faults(self, node: str) -> int:
        """Stop every fault running on the node now; how many were running."""
        ...


def pick_nodes(requested: list[str] | None, known: Iterable[str]) -> list[str]:
    """The nodes a per-node call targets: `requested` (in order, each once), or every known
    node when none is named. ValueError naming the unknown ones, before anything starts."""
    live = list(known)
    names = list(dict.fromkeys(requested)) if requested else live
    unknown = [n for n in names if n not in live]
    if unknown:
        raise ValueError(f"no live node {', '.join(map(repr, unknown))} (nodes: {', '.join(live)})")
    return names


__all__ = ["CacheWarmer", "Engine", "FaultInjector", "LaunchRequest", "NodeInfo", "pick_nodes"]
