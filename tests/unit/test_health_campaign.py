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


def test_no_fault_starts_that_could_not_run_its_whole_length_before_the_end() -> None:
    """Seed 7's 30-minute run started a 90 s fault 2 s before its end and counted it missed."""
    import time
    from types import SimpleNamespace

    from rich.console import Console

    from sluice.bench.health_campaign import _Campaign

    class Mon:
        transitions: list[Transition] = []

        def status(self) -> dict[str, dict[str, object]]:
            return {n: {"health": str(NodeHealth.HEALTHY), "model": True} for n in ("node-0", "node-1")}

    injected: list[str] = []
    engine = SimpleNamespace(inject_fault=lambda node, *a: injected.append(node) or SimpleNamespace(pids=[1]))
    plane = SimpleNamespace(
        controller=SimpleNamespace(view=lambda: SimpleNamespace(nodes={"node-0": 0, "node-1": 0})), engine=engine
    )
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115

    def run(seconds_left: float) -> list[str]:
        injected.clear()
        now = time.monotonic()
        camp = _Campaign(Mon(), 1, 90.0, (0.0, 0.0), 64, quiet, now, end=now + seconds_left)  # type: ignore[arg-type]
        for _ in range(3):  # the first tick draws the gap (0 s here), the next may start a fault
            camp.tick(plane, [])
        return injected

    assert run(seconds_left=30.0) == []  # 30 s left: a 90 s fault would be cut short
    assert len(run(seconds_left=600.0)) == 1
