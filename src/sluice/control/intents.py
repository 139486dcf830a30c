"""Why the controller asked a job to stop, so its exit is read the right way.

Persisted in the job record (`extra["stop_intent"]`) so that after a control-plane crash
an exit that arrives late is still understood as a preemption, a migration or a cancel
rather than a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.model import Allocation, JobRecord


@dataclass(frozen=True)
class StopIntent:
    kind: str  # "preempt" | "migrate" | "cancel"
    reason: str
    target: Allocation | None = None
    asked_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "target": self.target.to_list() if self.target else None,
            "asked_at": self.asked_at,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> StopIntent:
        t = d.get("target")
        return StopIntent(
            str(d["kind"]),
            str(d.get("reason", "")),
            Allocation.from_list(t) if t else None,
            float(d.get("asked_at", 0.0)),
        )


def get_intent(job: JobRecord) -> StopIntent | None:
    raw = job.extra.get("stop_intent")
    return StopIntent.from_dict(raw) if isinstance(raw, dict) else None


def set_intent(job: JobRecord, intent: StopIntent | None) -> None:
    if intent is None:
        job.extra.pop("stop_intent", None)
    else:
        job.extra["stop_intent"] = intent.to_dict()
