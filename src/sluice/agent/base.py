"""The node-agent contract. The local engine holds one NodeAgent per (virtual) node in
process; the Ray engine pins one, as an actor, to every Ray node. Same class, same calls.

Durability: an agent keeps what it needs to find its jobs again on disk (under its runs
directory), so a new agent — after a control-plane crash — adopts the processes that are
still running and reports the exit codes of those that ended while nobody was watching.
"""

from __future__ import annotations

from typing import Protocol

from sluice.model import Allocation, Event, LaunchRequest, NodeInfo


class NodeAgentAPI(Protocol):
    def info(self) -> NodeInfo:
        """This node's name, CPU cores offered to jobs, GPUs, memory, labels."""
        ...

    def launch(self, req: LaunchRequest) -> None:
        """Start one attempt (its own process group, real kernel CPU limit). Raises only for
        requests that can never work (bad workdir, program not found); the failure is also
        reported as JobExited so the controller's path is the same."""
        ...

    def resize(self, job_id: str, attempt: int, allocation: Allocation) -> None:
        """Change the CPU limit/weight of the running attempt in place (same PIDs)."""
        ...

    def stop(self, job_id: str, attempt: int, checkpoint: bool = True) -> None:
        """SIGTERM to the job's process group, SIGKILL after the grace period (or at once
        when checkpoint is False). Returns immediately; JobExited follows from poll()."""
        ...

    def poll(self) -> list[Event]:
        """JobStarted, JobProgress, JobUsage, JobCheckpointed, JobExited, NodeKPIs since the
        last call."""
        ...

    def alive(self) -> dict[str, int]:
        """job_id -> attempt for every job process of this node still running."""
        ...

    def log_path(self, job_id: str) -> str:
        """The job's log file (one per job, appended across attempts)."""
        ...

    def close(self) -> None:
        """Stop watching. Job processes keep running (they are adopted by the next agent)."""
        ...
