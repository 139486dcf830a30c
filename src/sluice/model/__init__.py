"""Domain state: phases and their transition table, allocations, decisions, events, views."""

from sluice.model.allocation import Allocation, Assignment
from sluice.model.capabilities import EngineCapabilities
from sluice.model.decision import Decision, Migrate, NodeDecision, Place, Preempt, Resize, SetNodeHealth, Wait
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
    OomKill,
)
from sluice.model.job import JobRecord, StopIntent, StopKind
from sluice.model.launch import JobUser, LaunchRequest, NodeInfo
from sluice.model.oracle import ORACLE_LABEL, OracleInfo, OracleSource, SpeedupFn
from sluice.model.phase import TERMINAL, TRANSITIONS, IllegalTransition, Phase, can_transition
from sluice.model.progress import AllocShape, ProgressSignals, ProgressTracker, RateSample, alloc_shape
from sluice.model.view import ClusterView, JobView, NodeHealth, NodeView, dataset_of

__all__ = [
    "ORACLE_LABEL",
    "TERMINAL",
    "TRANSITIONS",
    "AllocShape",
    "Allocation",
    "Assignment",
    "ClusterView",
    "Decision",
    "EngineCapabilities",
    "Event",
    "IllegalTransition",
    "JobCheckpointed",
    "JobExited",
    "JobProgress",
    "JobRecord",
    "JobStarted",
    "JobUsage",
    "JobUser",
    "JobView",
    "LaunchRequest",
    "Migrate",
    "NodeCache",
    "NodeDecision",
    "NodeHealth",
    "NodeInfo",
    "NodeKPIs",
    "NodeLost",
    "NodeUp",
    "NodeView",
    "OomKill",
    "OracleInfo",
    "OracleSource",
    "Phase",
    "Place",
    "Preempt",
    "ProgressSignals",
    "ProgressTracker",
    "RateSample",
    "Resize",
    "SetNodeHealth",
    "SpeedupFn",
    "StopIntent",
    "StopKind",
    "Wait",
    "alloc_shape",
    "can_transition",
    "dataset_of",
]
