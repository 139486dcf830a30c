"""The campaign's bookkeeping: which cordons a fault explains, and the goals."""

from __future__ import annotations

from sluice.bench.health_campaign import CampaignResult, FaultRecord, _false_cordons
from sluice.health.monitor import HealthMonitor
from sluice.health.state import Transition
from sluice.model import NodeHealth


def cordon(node: str, t: float) -> Transition:
    return Transition(node, t, NodeHealth.SUSPECT, NodeHealth.CORDONED, "r")


def test_only_cordons_of_a_faulted_node_during_or_just_after_its_fault_are_explained() -> None:
    mon = HealthMonitor()
    fault = FaultRecord(1, "cpu", "node-1", 60.0, 90.0, started=1000.0)
    mon.transitions = [cordon("node-1", 1030.0), cordon("node-0", 1030.0), cordon("node-1", 1200.0)]
    false = _false_cordons(mon, [fault])
    assert [(f["node"], f["time"]) for f in false] == [("node-0", 1030.0), ("node-1", 1200.0)]


def test_goals_need_nine_in_ten_faults_cordoned_within_a_minute() -> None:
    caught = [FaultRecord(i, "io", "node-1", 0.0, 90.0, cordon_after_s=20.0) for i in range(9)]
    late = FaultRecord(9, "memory", "node-0", 0.0, 90.0, cordon_after_s=61.0)
    ok = CampaignResult(20.0, 1, [*caught, late], [], 30, [], (1, 1, 1), (1, 1, 1))
    assert ok.caught_share == 0.9 and all(ok.goals().values())
    missed = CampaignResult(20.0, 1, [*caught[:8], late, late], [], 30, ["j (x): failed"], (1, 1, 1), (1, 1, 1))
    assert missed.goals() == {
        ">= 90% of faults cordoned within 60s": False,
        "0 false cordons": True,
        "no job lost": False,
    }
