"""One Ray node's dataset warms: a tenant's slow warms never hold up another tenant's.

The node's agent actor warms in threads of its own (a warm takes as long as its source; the
actor answers one call at a time). They were a pool of 4 threads shared by every tenant, while
the plane lets each tenant have 2 source operations under way (`dataset_source_ops_per_tenant`)
and the plane 8 (`dataset_source_ops`): two tenants with slow sources (a server of theirs that
sends a byte a second) held all 4, and every other tenant's `dataset warm` on that node waited
behind them, its API request and slot held the while (red team s26). Now each warm has a thread
of its own; how many run at once is what the plane allows. No Ray cluster needed: the actor
class runs in this process, with a stand-in for the node agent.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from sluice.agent.ray_actor import RayNodeAgent
from sluice.data.warm import WarmReport


class _Agent:
    """The node agent's warm_dataset: datasets named slow-* take until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def warm_dataset(self, name: str, *_: Any) -> WarmReport:
        if name.startswith("slow"):
            self.release.wait(30)
        return WarmReport("n1", 1, 1, 0, 0.0, 1.0)


def _actor(agent: _Agent) -> RayNodeAgent:
    actor = RayNodeAgent.__new__(RayNodeAgent)  # what __init__ sets that warms use
    actor.node_name = "n1"
    actor._raylet_pid = os.getppid()
    actor._agent = agent  # type: ignore[assignment]
    actor._warms = {}
    actor._warm_done = {}
    return actor


def test_slow_warms_of_two_tenants_do_not_hold_up_a_third_tenants_warm() -> None:
    agent = _Agent()
    actor = _actor(agent)
    try:
        slow = [actor.warm_start(f"slow-{t}-{i}", "/src") for t in ("alice", "bob") for i in range(2)]
        t0 = time.monotonic()
        ticket = actor.warm_start("carol/imgs", "/src")
        report = None
        while report is None and time.monotonic() - t0 < 5:
            report = actor.warm_result(ticket, 0.5)
        assert report is not None, "carol's warm waited behind alice's and bob's slow ones"
        assert report.error is None
        assert all(actor.warm_result(t, 0.0) is None for t in slow)  # still under way
    finally:
        agent.release.set()


def test_a_warm_whose_result_nobody_fetches_is_forgotten_later(monkeypatch: Any) -> None:
    """A plane that dies while it waits for a warm never asks for its result; the actor lives
    on, and every such warm was kept for good. One that ended WARM_UNCLAIMED_S ago is dropped
    at the next warm's start; one still running, or one fetched in time, is not touched."""
    import sluice.agent.ray_actor as ray_actor

    agent = _Agent()
    actor = _actor(agent)
    try:
        abandoned = actor.warm_start("carol/imgs", "/src")
        running = actor.warm_start("slow-bob", "/src")
        deadline = time.monotonic() + 5
        while abandoned not in actor._warm_done and time.monotonic() < deadline:
            time.sleep(0.01)
        monkeypatch.setattr(ray_actor, "WARM_UNCLAIMED_S", 0.0)
        time.sleep(0.01)
        fresh = actor.warm_start("carol/more", "/src")
        assert abandoned not in actor._warms and running in actor._warms and fresh in actor._warms
        monkeypatch.setattr(ray_actor, "WARM_UNCLAIMED_S", 600.0)
        report = None
        while report is None and time.monotonic() < deadline:
            report = actor.warm_result(fresh, 0.5)
        assert report is not None and fresh not in actor._warms and fresh not in actor._warm_done
    finally:
        agent.release.set()
