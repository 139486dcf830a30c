"""The health monitor: NodeKPIs events in, node health transitions (with reasons) out.

Per node it learns the node's own healthy behaviour (the first `train_samples` KPI samples,
or a model saved by an earlier run), then scores every new sample's window with the flow
detector, turns scores into alarms with a SPOT threshold, and feeds the alarms to the
Healthy → Suspect → Cordoned → Healthy state machine. A transition goes to the controller's
`set_node_health`, which persists it in the store (save_node + event log), makes the node
unschedulable when Cordoned and moves its jobs off through checkpoints.

Runs as a controller observer (called each reconcile round with that round's events), so
it adds no thread of its own except, optionally, the one fitting a node's model.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sluice.health.attribution import describe
from sluice.health.detector import DetectorConfig, FlowDetector
from sluice.health.spot import Spot
from sluice.health.state import HealthRules, NodeHealthMachine, Transition
from sluice.model import Event, NodeHealth, NodeKPIs

log = logging.getLogger("sluice.health")


class HealthTarget(Protocol):
    """What the monitor drives: the Controller satisfies it."""

    def set_node_health(self, node: str, health: NodeHealth, reason: str, by: str = "detector") -> None: ...


def _online_detector() -> DetectorConfig:
    # Small and quick: a node model is fitted inside the control plane on a few minutes of
    # 1 Hz samples, on one thread, while the control plane keeps working.
    return DetectorConfig(
        history=8,
        hidden=32,
        transforms=3,
        epochs=60,
        max_train_s=30.0,
        val_fraction=0.3,
        smooth=5,
        min_scale=0.1,
        threads=1,
        noise=0.1,
    )


MACHINE_WIDE: tuple[str, ...] = (
    "load1_per_core",
    "mem_*",
    "swap_*",
    "disk_*",
    "net_*",
    "ctx_switches_ps",
    "interrupts_ps",
)
"""KPIs of the whole machine rather than of one (virtual) node's cores and jobs."""


@dataclass
class MonitorConfig:
    """train_samples: healthy samples a node must show before its model is fitted.
    q: SPOT risk per sample. ignore: glob patterns of KPIs left out of the model
    (bookkeeping like `jobs`; with virtual nodes on one machine also MACHINE_WIDE, which
    every virtual node sees alike and so cannot tell which node is sick).
    models_dir: where fitted node models are saved and looked for (None = not kept).
    background: fit models on a thread (True in the control plane; tests may use False)."""

    train_samples: int = 300
    q: float = 1e-3
    rules: HealthRules = field(default_factory=HealthRules)
    detector: DetectorConfig = field(default_factory=_online_detector)
    ignore: tuple[str, ...] = ("jobs",)
    models_dir: Path | None = None
    background: bool = True
    top_n: int = 3
    max_cordoned_fraction: float = 0.5
    """At most this share of the nodes may be cordoned by the detector at once (as the
    Kubernetes node controller stops evicting when a whole zone looks unhealthy): when many
    nodes look sick together the cause is usually shared (the workload, the network, a
    noisy fault next door), and cordoning them all would stop the cluster. Nodes over the
    cap stay Suspect."""


@dataclass
class NodeTrack:
    """Everything the monitor keeps for one node."""

    machine: NodeHealthMachine
    keys: list[str] | None = None
    rows: deque[np.ndarray] = field(default_factory=deque)
    detector: FlowDetector | None = None
    spot: Spot | None = None
    training: threading.Thread | None = None
    last_score: float = float("nan")
    last_reason: str = ""
    alarms: int = 0
    scored: int = 0
    severity: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    """score/threshold of the recent alarms: which of several sick nodes is sickest."""


class HealthMonitor:
    def __init__(
        self,
        target: HealthTarget,
        config: MonitorConfig | None = None,
        saved: Mapping[str, tuple[NodeHealth, str, str | None]] | None = None,
    ) -> None:
        """`saved`: node -> (health, reason, cordoned_by) from the store, so a cordon set
        before a restart keeps its owner (an operator cordon is never lifted by the detector)."""
        self.target = target
        self.config = config or MonitorConfig()
        self.nodes: dict[str, NodeTrack] = {}
        self.transitions: list[Transition] = []
        self._lock = threading.Lock()
        for node, (health, reason, by) in (saved or {}).items():
            m = self._track(node).machine
            m.state, m.reason, m.cordoned_by = health, reason, by

    # ------------------------------------------------------------------ wiring
    @classmethod
    def attach(cls, controller: Any, config: MonitorConfig | None = None) -> HealthMonitor:
        """Build a monitor for a Controller: state restored from its store, registered as an
        observer of its rounds."""
        saved = {r.name: (r.health, r.reason, r.cordoned_by) for r in controller.store.list_nodes()}
        mon = cls(controller, config, saved)
        controller.observers.append(mon)
        return mon

    def __call__(self, controller: Any, events: Sequence[Event]) -> None:
        nodes = getattr(controller, "nodes", {})
        last = None
        for e in events:
            if isinstance(e, NodeKPIs):
                st = nodes.get(e.node)
                self.observe(e, None if st is None else st.health, settle=False)
                last = e.time
        if last is not None:
            self._settle(last)

    # ------------------------------------------------------------------ per sample
    def _track(self, node: str) -> NodeTrack:
        tr = self.nodes.get(node)
        if tr is None:
            keep = max(self.config.train_samples, self.config.detector.history + self.config.detector.target) + 1
            tr = NodeTrack(NodeHealthMachine(node, self.config.rules), rows=deque(maxlen=keep))
            self.nodes[node] = tr
            self._load(node, tr)
        return tr

    def observe(self, e: NodeKPIs, current: NodeHealth | None = None, settle: bool = True) -> Transition | None:
        """Score one sample. `current`: the node's health as the controller has it now, so an
        operator's cordon/uncordon made elsewhere is honoured. Cordons are decided in
        `_settle`, after every sample of a round is in (settle=False defers it), so when
        several nodes qualify at once the sickest is cordoned first."""
        tr = self._track(e.node)
        self._sync(tr, current, e.time)
        if tr.keys is None:
            tr.keys = sorted(k for k in e.values if not any(fnmatch.fnmatch(k, p) for p in self.config.ignore))
        tr.rows.append(np.asarray([float(e.values.get(k, 0.0)) for k in tr.keys], dtype=np.float32))
        with self._lock:
            det, spot = tr.detector, tr.spot
        if det is None or spot is None:
            if tr.training is None and len(tr.rows) >= self.config.train_samples:
                self._fit(e.node, tr)
            return None
        need = det.config.history + det.config.target + det.config.smooth - 1
        window = np.stack(list(tr.rows)[-need:])
        score = float(det.score_windows(window)[-1])
        tr.last_score, tr.scored = score, tr.scored + 1
        alarm = spot.step(score)
        why = ""
        if alarm:
            tr.alarms += 1
            tr.severity.append(score / max(abs(spot.threshold), 1e-9))
            why = describe(score, spot.threshold, det.attribute(window), self.config.top_n)
            tr.last_reason = why
        t = tr.machine.observe(e.time, alarm, why, may_cordon=False)
        if t is not None:
            self._apply(t)
        if settle:
            t = self._settle(e.time).get(e.node, t)
        return t

    def _settle(self, now: float) -> dict[str, Transition]:
        """Cordon qualifying nodes, sickest (highest recent score/threshold) first, within the cap."""
        done: dict[str, Transition] = {}
        ready = [(n, tr) for n, tr in self.nodes.items() if tr.machine.qualifies()]
        ready.sort(key=lambda kv: -float(np.mean(kv[1].severity)) if kv[1].severity else 0.0)
        for node, tr in ready:
            if not self._may_cordon():
                break
            t = tr.machine.cordon(now, tr.machine.cordon_reason(tr.last_reason), by="detector")
            if t is not None:
                self._apply(t)
                done[node] = t
        return done

    def _may_cordon(self) -> bool:
        cordoned = sum(1 for t in self.nodes.values() if t.machine.state == NodeHealth.CORDONED)
        return cordoned + 1 <= max(1, int(self.config.max_cordoned_fraction * len(self.nodes)))

    def _sync(self, tr: NodeTrack, current: NodeHealth | None, now: float) -> None:
        m = tr.machine
        if current is None or current == m.state or current == NodeHealth.LOST:
            return
        if current == NodeHealth.CORDONED:
            m.cordon(now, "cordoned by operator", by="operator")
        elif current == NodeHealth.HEALTHY and m.state in (NodeHealth.CORDONED, NodeHealth.SUSPECT):
            m.uncordon(now, "uncordoned by operator")

    def _apply(self, t: Transition) -> None:
        self.transitions.append(t)
        log.info("node %s: %s -> %s (%s)", t.node, t.old, t.new, t.reason)
        try:
            self.target.set_node_health(t.node, t.new, t.reason, by="detector")
        except KeyError:
            log.warning("node %s is unknown to the controller; health %s not applied", t.node, t.new)

    # ------------------------------------------------------------------ models
    def _fit(self, node: str, tr: NodeTrack) -> None:
        data = np.stack(list(tr.rows))
        keys = list(tr.keys or [])

        def work() -> None:
            det = FlowDetector(self.config.detector)
            det.fit(data, keys)
            spot = _spot(self.config.q, det.calibration)
            if self.config.models_dir is not None:
                self.config.models_dir.mkdir(parents=True, exist_ok=True)
                det.save(self.config.models_dir / f"{node}.pt")
            with self._lock:
                tr.detector, tr.spot = det, spot
            log.info("node %s: model fitted on %d samples, threshold %.2f", node, len(data), spot.threshold)

        if self.config.background:
            thread = threading.Thread(target=work, name=f"health-fit-{node}", daemon=True)
            thread.start()  # started before it is published, so wait_ready() never joins an unstarted thread
            tr.training = thread
        else:
            tr.training = threading.current_thread()
            work()

    def _load(self, node: str, tr: NodeTrack) -> None:
        if self.config.models_dir is None:
            return
        path = self.config.models_dir / f"{node}.pt"
        if not path.exists():
            return
        try:
            det = FlowDetector.load(path)
        except Exception as err:  # a corrupt or old model: learn again rather than fail
            log.warning("node %s: cannot load %s (%s); learning a new model", node, path, err)
            return
        tr.detector, tr.keys = det, list(det.kpis)
        tr.spot = _spot(self.config.q, det.calibration)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait for every node's model fitting to finish (tests, `sluice demo`)."""
        for tr in self.nodes.values():
            if tr.training is not None and tr.training is not threading.current_thread():
                tr.training.join(timeout)
        return all(tr.detector is not None for tr in self.nodes.values())

    def status(self) -> dict[str, dict[str, object]]:
        """Per node: state, reason, whether a model is ready, last score and threshold."""
        return {
            n: {
                "health": str(tr.machine.state),
                "reason": tr.machine.reason,
                "model": tr.detector is not None,
                "samples": len(tr.rows),
                "score": tr.last_score,
                "threshold": tr.spot.threshold if tr.spot else float("nan"),
                "alarms": tr.alarms,
                "scored": tr.scored,
            }
            for n, tr in self.nodes.items()
        }


def _spot(q: float, calibration: np.ndarray) -> Spot:
    """SPOT on the held-out healthy scores. A few minutes of samples give too few scores to
    fit a tail, so with fewer than 200 the threshold is also kept above the largest healthy
    score plus its distance from the median (no healthy score seen would come near it)."""
    spot = Spot(q=q, level=_level(len(calibration)))
    if 0 < len(calibration) < 200:
        top, mid = float(np.max(calibration)), float(np.median(calibration))
        spot.floor = top + (top - mid)
    return spot.fit(calibration)


def _level(n: int) -> float:
    """Initial SPOT quantile: 0.98 when there are enough calibration scores to leave a tail
    of excesses to fit; lower on a short healthy history so some peaks remain."""
    return min(0.98, max(0.8, 1.0 - 10.0 / max(n, 1)))


OnTransition = Callable[[Transition], None]
