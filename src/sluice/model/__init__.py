"""Domain state: phases and their transition table, allocations, decisions, events, views."""

from sluice.model.allocation import Allocation, Assignment
from sluice.model.decision import Decision, Migrate, Place, Preempt, Resize, Wait
from sluice.model.events import (
    Event,
    JobCheckpointed,
    JobExited,
    JobProgress,
    JobStarted,
    JobUsage,
    NodeCache,
    NodeKPIs,
    NodeLost,
    NodeUp,
)
from sluice.model.job import JobRecord
from sluice.model.launch import LaunchRequest, NodeInfo
from sluice.model.phase import TERMINAL, TRANSITIONS, IllegalTransition, Phase, can_transition
from sluice.model.progress import ProgressSignals, ProgressTracker
from sluice.model.view import ClusterView, JobView, NodeHealth, NodeView, SpeedupFn

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "Allocation",
    "Assignment",
    "ClusterView",
    "Decision",
    "Event",
    "IllegalTransition",
    "JobCheckpointed",
    "JobExited",
    "JobProgress",
    "JobRecord",
    "JobStarted",
    "JobUsage",
    "JobView",
    "LaunchRequest",
    "Migrate",
    "NodeCache",
    "NodeHealth",
    "NodeInfo",
    "NodeKPIs",
    "NodeLost",
    "NodeUp",
    "NodeView",
    "Phase",
    "Place",
    "Preempt",
    "ProgressSignals",
    "ProgressTracker",
    "Resize",
    "SpeedupFn",
    "Wait",
    "can_transition",
]
