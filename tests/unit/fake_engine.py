"""FakeEngine: an in-memory stand-in for an engine, for controller unit tests only.

It is a fake (no processes): it records what the controller asked and lets a test push the
events a real engine would report. Real-process behaviour is covered by the integration
tests on the local and Ray engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.model import Allocation, EngineCapabilities, Event, LaunchRequest, NodeInfo


@dataclass
class FakeEngine:
    name: str = "fake"
    checkpoint_root: str | None = None
    capabilities: EngineCapabilities = EngineCapabilities(
        live_cpu_resize=True, gang_launch=True, migration=True, job_progress=True, max_replicas=8
    )
    node_infos: list[NodeInfo] = field(default_factory=lambda: [NodeInfo("n0", 2.0), NodeInfo("n1", 2.0)])
    now: float = 1000.0
    launched: list[LaunchRequest] = field(default_factory=list)
    resized: list[tuple[str, int, Allocation]] = field(default_factory=list)
    stopped: list[tuple[str, int, bool]] = field(default_factory=list)
    pending: list[Event] = field(default_factory=list)
    running: dict[str, int] = field(default_factory=dict)

    def nodes(self) -> list[NodeInfo]:
        return list(self.node_infos)

    def launch(self, req: LaunchRequest) -> None:
        self.launched.append(req)
        self.running[req.job_id] = req.attempt

    def resize(self, job_id: str, attempt: int, allocation: Allocation) -> None:
        self.resized.append((job_id, attempt, allocation))

    def stop(self, job_id: str, attempt: int, checkpoint: bool = True) -> None:
        self.stopped.append((job_id, attempt, checkpoint))

    def poll(self) -> list[Event]:
        out, self.pending = self.pending, []
        return out

    def clock(self) -> float:
        return self.now

    def alive(self) -> dict[str, int]:
        return dict(self.running)

    def log_path(self, job_id: str) -> str | None:
        return None

    def earlier_logs(self, job_id: str) -> list[str]:
        return []

    def replica_log(self, job_id: str, rank: int) -> str | None:
        return None

    def close(self) -> None:
        pass
