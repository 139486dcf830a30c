"""Node health states: Healthy → Suspect → Cordoned → (sustained healthy scores) → Healthy.

Why a state machine and not "alarm = cordon": a single extreme score is often a one-off
(a cron job, a log rotation), and moving jobs costs a checkpoint and a restart. One alarm
makes a node Suspect (still schedulable, visible to operators); only repeated alarms within
a short window cordon it; and a cordoned node comes back only after a sustained stretch
with no alarm, so a flapping node does not ping-pong jobs. Pure: plain values and the
caller's clock, so it is tested without time passing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sluice.model import NodeHealth


@dataclass(frozen=True)
class HealthRules:
    """cordon_alarms alarms within cordon_window_s cordon a node; a Suspect node is cleared
    after clear_s without alarms; a detector-cordoned node is re-admitted after readmit_s
    without alarms (all seconds, on the caller's clock)."""

    cordon_alarms: int = 5
    cordon_window_s: float = 30.0
    clear_s: float = 30.0
    readmit_s: float = 120.0


@dataclass(frozen=True)
class Transition:
    node: str
    time: float
    old: NodeHealth
    new: NodeHealth
    reason: str


@dataclass
class NodeHealthMachine:
    """One node's health, fed one observation (alarm or not) per scored KPI sample.

    An operator cordon (`cordon(..., by="operator")`) pins the node: the detector can
    neither cordon it again nor re-admit it; only `uncordon` does.
    """

    node: str
    rules: HealthRules = field(default_factory=HealthRules)
    state: NodeHealth = NodeHealth.HEALTHY
    reason: str = ""
    cordoned_by: str | None = None
    last_alarm: float | None = None
    since: float = 0.0
    watched_from: float | None = None
    """Time of the first sample this machine saw. A state restored from the store after a
    restart has no `last_alarm`: its quiet is counted from here, so a node the detector
    cordoned is re-admitted after `readmit_s` of healthy samples, not at the first one."""
    _alarms: deque[float] = field(default_factory=deque)

    def observe(self, time: float, alarm: bool, why: str = "", may_cordon: bool = True) -> Transition | None:
        """`why` describes the alarm (score, threshold, top KPIs); it becomes the reason.
        `may_cordon` False keeps a node that qualifies for a cordon Suspect (the caller's
        cap on how much of the cluster the detector may take out at once)."""
        if self.watched_from is None:
            self.watched_from = time
        if alarm:
            self.last_alarm = time
            self._alarms.append(time)
        while self._alarms and self._alarms[0] < time - self.rules.cordon_window_s:
            self._alarms.popleft()
        if self.cordoned_by == "operator":
            return None
        quiet = time - (self.last_alarm if self.last_alarm is not None else self.watched_from)
        if self.state == NodeHealth.HEALTHY and alarm:
            return self._move(time, NodeHealth.SUSPECT, f"anomaly: {why}")
        if self.state == NodeHealth.SUSPECT:
            if len(self._alarms) >= self.rules.cordon_alarms and may_cordon:
                return self._move(time, NodeHealth.CORDONED, self.cordon_reason(why), by="detector")
            if quiet >= self.rules.clear_s:
                return self._move(time, NodeHealth.HEALTHY, f"no anomaly for {quiet:.0f}s")
        if self.state == NodeHealth.CORDONED and self.cordoned_by == "detector" and quiet >= self.rules.readmit_s:
            return self._move(time, NodeHealth.HEALTHY, f"re-admitted: healthy scores for {quiet:.0f}s")
        return None

    def qualifies(self) -> bool:
        """Suspect with enough recent alarms to be cordoned (used when the caller withholds
        cordons to rank several sick nodes)."""
        return self.state == NodeHealth.SUSPECT and len(self._alarms) >= self.rules.cordon_alarms

    def cordon_reason(self, why: str) -> str:
        return f"{len(self._alarms)} anomalies in {self.rules.cordon_window_s:g}s: {why}"

    def cordon(self, time: float, reason: str, by: str = "operator") -> Transition | None:
        if self.state == NodeHealth.CORDONED and self.cordoned_by == by:
            return None
        return self._move(time, NodeHealth.CORDONED, reason, by=by)

    def uncordon(self, time: float, reason: str) -> Transition | None:
        """Operator re-admission: also forgets recent alarms, so the node is not re-cordoned
        by the alarms that cordoned it."""
        self._alarms.clear()
        self.last_alarm = None
        if self.state == NodeHealth.HEALTHY:
            return None
        return self._move(time, NodeHealth.HEALTHY, reason)

    def _move(self, time: float, new: NodeHealth, reason: str, by: str | None = None) -> Transition:
        t = Transition(self.node, time, self.state, new, reason)
        self.state, self.reason, self.since = new, reason, time
        self.cordoned_by = by if new == NodeHealth.CORDONED else None
        if new == NodeHealth.HEALTHY:
            self._alarms.clear()
        return t
