"""The health monitor: NodeKPIs events in, node health decisions (with reasons) out.

Per node it learns the node's own healthy behaviour (the first `train_samples` KPI samples,
or a model saved by an earlier run), then scores every new sample's window with the flow
detector, turns scores into alarms with a SPOT threshold, and feeds the alarms to the
Healthy → Suspect → Cordoned → Healthy state machine. A transition becomes a
`SetNodeHealth` decision that the monitor returns to the controller, which executes it like
any other decision: persisted in the store (node record + event log), the node made
unschedulable when Cordoned and its jobs moved off through checkpoints. The monitor never
acts on the cluster itself.

Runs as a round observer (`observe(view, events)` each reconcile round), so it adds no
thread of its own except, optionally, the one fitting a node's model.

Two things keep it from crying wolf on a busy cluster (issue 5: false cordons of a healthy
node under the demo workload):
- **Scheduling changes are known, not anomalies.** Each round the monitor compares what the
  controller has placed on every node (jobs and their CPU limits) with the last round, and
  sees the agents' job start/exit/checkpoint events. After such a change the node's alarms
  are *held* for `change_grace_s`: scored and shown, but not counted towards Suspect or
  Cordoned. Only an anomaly that *began after* the change is explained by it: a run of
  alarms that started before a change keeps counting through that change's grace, so on a
  busy node (FlowCon resizes every 30 s, every job checkpoints every 30 s) a fault is
  delayed by at most one grace, not hidden behind the next change and the next.
- **It keeps learning.** A node's first model is fitted on a few minutes of samples, which
  rarely show every job mix the scheduler will make. While the node is Healthy its samples
  are kept (up to `history_samples`), and the model is refitted on the longer history each
  time it has grown by `retrain_growth`, then as a sliding window. A sample that scores over
  the threshold is not kept, held or not: what a grace excuses is not what a node is.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from sluice.health.attribution import describe
from sluice.health.detector import DetectorConfig, FlowDetector, smooth_scores
from sluice.health.spot import DSpot, Spot
from sluice.health.state import HealthRules, NodeHealthMachine, Transition
from sluice.model import (
    Allocation,
    ClusterView,
    Event,
    JobCheckpointed,
    JobExited,
    JobStarted,
    NodeHealth,
    NodeKPIs,
    SetNodeHealth,
)

log = logging.getLogger("sluice.health")


FIT_NICENESS = 5
"""How far below the control plane's priority a node model is fitted (nice increment)."""


class SavedNode(Protocol):
    """A node's health as the store kept it (store.NodeRecord has these fields)."""

    name: str
    health: NodeHealth
    reason: str
    cordoned_by: str | None


def _online_detector() -> DetectorConfig:
    # Small and quick: a node model is fitted inside the control plane on a few minutes of
    # 1 Hz samples, on one thread, while the control plane keeps working.
    return DetectorConfig(
        history=8,
        target=1,  # the offline default is 4; here 4 alarmed ~47 times per healthy node and cordoned one
        # in a replay of campaign 17, 1 none (docs/benchmarks.md)
        hidden=32,
        transforms=3,
        epochs=60,
        max_train_s=30.0,
        val_fraction=0.3,
        smooth=5,
        decay=0.0,  # equal weights, as before DetectorConfig.decay existed (live loop unchanged)
        min_scale=0.1,
        pct_floor=2.0,  # two clock ticks a second: a calm core's 0/1 % jitter is not a fault
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
    "cpu*",
    "job_steps_log_per_job",
    "peer_excess_cpu_*",
    "node_cpu_used_pct",
    "node_cpu_system_pct",
    "node_cpu_throttled_pct",
    "node_psi_cpu_pct",
    "node_mem_used_pct",
    "node_mem_majfaults_ps",
    "node_io_*",
    "node_net_tx_*",
    "node_net_rx_*",
)
"""What virtual nodes of one machine are *not* judged on (pass as `ignore`): the
machine-wide counters; the absolute core times and job speed, which follow the whole
machine's load (unpinned processes and other tenants float over every core); and, from the
node's own cgroups (`node_*`, agent/node_cgroup.py), everything the node's jobs make: its
total CPU, kernel time, memory held, major page faults, block I/O and network traffic
(`node_net_tx_*`, `node_net_rx_*`) follow how many jobs the
scheduler put there and what they do (a first campaign run cordoned healthy nodes on
`node_io_read_mbps`, `node_mem_used_pct`, `node_cpu_system_pct` while jobs started; a second
on `node_mem_majfaults_ps` bursts at job starts), their throttling follows their limits, and
the node's CPU stall follows the machine's load.

What is judged: CPU used in the node by anything but its jobs (`node_cpu_other_pct`), network
traffic sent and received in the node by anything but its jobs (`node_net_other_tx_mbps`,
and `node_net_other_rx_mbps` where the node has a v2 group), the
share of time its processes stalled on memory or I/O (`node_psi_memory*`, `node_psi_io*`),
and memory limit hits. A fault injected in the node (`sluice node fault`) shows there; a
process started outside every sluice cgroup only through the stalls it causes.

The peer excess of the node's cores over the machine's other cores (`peer_excess_cpu_*`) is
not judged either, *where the node's own cgroup KPIs exist*: once one node is cordoned, the
other holds every job and its cores' kernel time exceeds the idle sibling's — the second
campaign run cordoned both nodes that way, each right after the other was cordoned. Where
they do not exist (no writable cgroups), the monitor falls back to judging the excess of
kernel time and I/O wait (`PEER_FALLBACK`), as before the node cgroups."""

PEER_FALLBACK: tuple[str, ...] = ("peer_excess_cpu_system_pct", "peer_excess_cpu_iowait_pct")
"""Judged on a virtual node whose samples carry no `node_*` KPI (no usable cgroups there):
its cores' excess kernel time and I/O wait over the machine's other cores, which training
jobs do not make and an I/O storm or memory pressure on its cores do."""

NOT_MODELLED: tuple[str, ...] = ("jobs", "job_steps_ps", "job_steps_log_per_job")
"""Never modelled, whatever `ignore` says. How many jobs run and their raw steps/s are set by
the scheduler (an MLP makes 100x the steps of a CNN), not by the node's health. And no job
throughput at all, even per job in logs: steps are what a tenant's job *says* (`sdk.report`),
so a job that reported a billion steps a second made its node Suspect (ops walk s31: score
2.1e5 against a threshold of 20, the step KPI 83 % of the alarm), and on a cluster of several
nodes a tenant could have had any node it runs on cordoned and every other tenant's jobs
moved off it. A node is judged only on what the kernel measures. A model saved with one of
these is learned again (`_load`)."""


THRESHOLD_RULES = ("spot", "dspot")
"""The rules `MonitorConfig.threshold` may name (`make_threshold`)."""


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
    threshold: str = "dspot"
    """How scores become alarms: `dspot` (drift-aware: a threshold on the score's excess over
    the mean of the `dspot_depth` newest non-alarm scores) or `spot` (a threshold on the
    score itself). Both are fitted on the node's healthy calibration scores, updated by
    healthy peaks and bounded (`make_threshold`). dspot since session 14: on three recorded
    campaigns it cordoned the same faults as spot, as fast, with 22 alarms counted on
    healthy nodes against 58 (docs/health.md, "Drift-aware thresholds")."""
    dspot_depth: int = 100
    """`dspot`: how many recent non-alarm scores make the level (samples; 100 ≈ 100 s at
    1 Hz; the depth the leave-servers-out protocol chose on ASD in every fold)."""
    rules: HealthRules = field(default_factory=HealthRules)
    detector: DetectorConfig = field(default_factory=_online_detector)
    ignore: tuple[str, ...] = ("jobs",)
    models_dir: Path | None = None
    background: bool = True
    top_n: int = 3
    change_grace_s: float = 20.0
    """Seconds after a scheduling change on a node (a job placed, stopped, moved or resized
    there; a checkpoint written) during which its alarms are held: its KPIs move because
    the control plane moved them. A real fault still alarms once the grace ends."""
    checkpoint_grace_s: float = 5.0
    """The (shorter) hold after a job on the node writes a checkpoint (seconds): a save is a
    burst of a few seconds, and jobs save every `checkpoint.interval_s` (30 s by default),
    so a full `change_grace_s` after each would leave a busy node never judged."""
    run_gap_s: float = 10.0
    """Alarms closer than this (seconds) form one run; a change explains a run only if it was
    made before the run's first alarm."""
    resize_min_cores: float = 0.25
    """A change of the node's total job CPU limit counts as a scheduling change from this
    many cores on (cores); smaller trims do not move the node's KPIs."""
    retrain_growth: float = 2.0
    """Refit a node's model when its healthy history has grown to this multiple of what the
    current model learned from (2.0: at 2x, 4x, ... the first training samples); once
    `history_samples` is reached, after that many new samples again (a sliding window).
    1 or less (e.g. 0) = never refit."""
    history_samples: int = 1800
    """Healthy samples kept per node for refits (samples; 1800 = 30 min at 1 Hz)."""
    max_cordoned_fraction: float = 0.5
    """At most this share of the nodes may be cordoned by the detector at once, rounded down
    (as the Kubernetes node controller stops evicting when a whole zone looks unhealthy):
    when many nodes look sick together the cause is usually shared (the workload, the
    network, a noisy fault next door), and cordoning them all would stop the cluster. Nodes
    over the cap stay Suspect. So on a one-node cluster the detector never cordons (its
    jobs would have nowhere to go): the node goes Suspect, and an operator may cordon it."""

    def __post_init__(self) -> None:
        # Checked here, not when a node's model is fitted: that happens on a background
        # thread, where a bad rule would only leave the node without a model.
        if self.threshold not in THRESHOLD_RULES:
            raise ValueError(f"threshold: {self.threshold!r} is not 'spot' or 'dspot'")
        if self.dspot_depth < 1:
            raise ValueError(f"dspot_depth: {self.dspot_depth} must be at least 1")


@dataclass
class NodeTrack:
    """Everything the monitor keeps for one node."""

    machine: NodeHealthMachine
    keys: list[str] | None = None
    rows: deque[np.ndarray] = field(default_factory=deque)
    """The newest samples (enough for one scoring window)."""
    times: deque[float] = field(default_factory=deque)
    """When each of `rows` was sampled."""
    healthy: deque[np.ndarray] = field(default_factory=deque)
    """Samples seen while the node was Healthy: what its model learns from."""
    fresh: int = 0
    """Healthy samples added since the current model's data was taken."""
    trained_on: int = 0
    """Samples the current model learned from (0: none yet, or a loaded model)."""
    fits: int = 0
    grace_until: float = float("-inf")
    """The end of the latest scheduling change's grace."""
    last_time: float = float("-inf")
    """Time of the newest sample scored."""
    explained_until: float = float("-inf")
    """The current run of alarms is held until this time: the grace of the changes made
    before the run began (changes made during it explain nothing)."""
    last_alarm_at: float | None = None
    """Time of the newest over-threshold score (held or not): ends a run after `run_gap_s`."""
    held: int = 0
    """Alarms held because a scheduling change explains them."""
    detector: FlowDetector | None = None
    spot: Spot | DSpot | None = None
    training: threading.Thread | None = None
    last_score: float = float("nan")
    scored_at: float | None = None
    """Sample time of `last_score`: while a node's model learns, it is not scored at all."""
    last_reason: str = ""
    alarms: int = 0
    scored: int = 0
    severity: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    """score/threshold of the recent alarms: which of several sick nodes is sickest."""
    why: dict[str, object] = field(default_factory=dict)
    """The newest counted alarm, explained (`sluice node why`): when, score and threshold, and
    per KPI that drove it its share, its value then and its healthy mean and spread."""


class HealthMonitor:
    def __init__(self, config: MonitorConfig | None = None, saved: Iterable[SavedNode] = ()) -> None:
        """`saved`: the nodes' health from the store, so a cordon set before a restart keeps
        its owner (an operator cordon is never lifted by the detector)."""
        self.config = config or MonitorConfig()
        self.nodes: dict[str, NodeTrack] = {}
        self.transitions: list[Transition] = []
        self._lock = threading.Lock()
        self.tap: Callable[[str, list[str], np.ndarray, float], None] | None = None
        """Called with (node, KPI names, row, sample time) for every sample, as modelled:
        how `sluice bench health --campaign --record` keeps labelled traces."""
        self._placed: dict[str, tuple[frozenset[str], float]] = {}
        self._allocs: dict[str, Allocation] = {}
        self._outbox: list[SetNodeHealth] = []
        for rec in saved:
            m = self._track(rec.name).machine
            m.state, m.reason, m.cordoned_by = rec.health, rec.reason, rec.cordoned_by

    # ------------------------------------------------------------------ the round
    def observe(self, view: ClusterView, events: Sequence[Event]) -> list[SetNodeHealth]:
        """One reconcile round: learn what the control plane changed, score the round's KPI
        samples, and return the node health changes that follow, each with its reason."""
        kpi_times = [e.time for e in events if isinstance(e, NodeKPIs)]
        now = max(kpi_times) if kpi_times else view.now
        for node, why in self._scheduling_changes(view, events).items():
            grace = self.config.checkpoint_grace_s if why == "checkpoint" else None
            self.note_change(node, now, why, grace)
        last = None
        for e in events:
            if isinstance(e, NodeKPIs):
                nv = view.nodes.get(e.node)
                self.score(e, None if nv is None else nv.health, settle=False)
                last = e.time
        if last is not None:
            self.settle(last)
        return self.decisions()

    def decisions(self) -> list[SetNodeHealth]:
        """The health changes decided since the last call (and forget them)."""
        out, self._outbox = self._outbox, []
        return out

    # ------------------------------------------------------------------ scheduling changes
    def note_change(self, node: str, time: float, why: str = "", grace_s: float | None = None) -> None:
        """The control plane changed what runs on `node` at `time`: hold its alarms for
        `grace_s` (default `change_grace_s`). Callers without a Controller, and tests, call
        this directly."""
        grace = self.config.change_grace_s if grace_s is None else grace_s
        tr = self._track(node)
        tr.grace_until = max(tr.grace_until, time + grace)
        log.debug("node %s: scheduling change (%s); alarms held for %gs", node, why, grace)

    def in_grace(self, node: str, time: float) -> bool:
        tr = self.nodes.get(node)
        return tr is not None and time < tr.grace_until

    def _scheduling_changes(self, view: ClusterView, events: Sequence[Event]) -> dict[str, str]:
        """Nodes whose placement changed since the last round (jobs and total CPU limit, from
        the view) or whose jobs started, exited or checkpointed (events)."""
        placed: dict[str, tuple[set[str], float]] = {}
        allocs = dict(self._allocs)
        for jid, job in view.jobs.items():
            alloc = job.allocation
            if alloc is None or not job.phase.active:
                continue
            allocs[jid] = alloc
            for a in alloc.assignments:
                ids, cores = placed.setdefault(a.node, (set(), 0.0))
                limit = a.cpu_limit if a.cpu_limit is not None else a.cpu_request
                placed[a.node] = (ids | {f"{jid}.{job.attempt}"}, cores + float(limit))
        changed: dict[str, str] = {}
        for node in set(placed) | set(self._placed):
            ids, cores = placed.get(node, (set(), 0.0))
            old_ids, old_cores = self._placed.get(node, (frozenset(), 0.0))
            if ids != old_ids:
                changed[node] = "jobs placed or removed"
            elif abs(cores - old_cores) >= self.config.resize_min_cores:
                changed[node] = f"CPU limits {old_cores:.2f} -> {cores:.2f} cores"
        self._placed = {n: (frozenset(i), c) for n, (i, c) in placed.items()}
        for e in events:
            if isinstance(e, JobStarted):
                changed.setdefault(e.node, "job started")
            elif isinstance(e, JobExited | JobCheckpointed):
                # The view is taken after this round's exits: the allocation it held is the
                # one remembered from the rounds before.
                old = allocs.get(e.job_id)
                for node in old.nodes if old is not None else ():
                    changed.setdefault(node, "job exited" if isinstance(e, JobExited) else "checkpoint")
        live = {jid for jid, j in view.jobs.items() if j.allocation is not None and j.phase.active}
        self._allocs = {jid: a for jid, a in allocs.items() if jid in live}
        return changed

    # ------------------------------------------------------------------ per sample
    def _track(self, node: str) -> NodeTrack:
        tr = self.nodes.get(node)
        if tr is None:
            cfg = self.config
            keep = max(cfg.train_samples, cfg.detector.history + cfg.detector.target + cfg.detector.smooth) + 1
            tr = NodeTrack(
                NodeHealthMachine(node, cfg.rules),
                rows=deque(maxlen=keep),
                times=deque(maxlen=keep),
                healthy=deque(maxlen=max(cfg.history_samples, cfg.train_samples)),
            )
            self.nodes[node] = tr
            self._load(node, tr)
        return tr

    def score(self, e: NodeKPIs, current: NodeHealth | None = None, settle: bool = True) -> Transition | None:
        """Score one sample. `current`: the node's health as the controller has it now, so an
        operator's cordon/uncordon made elsewhere is honoured. Cordons are decided in
        `settle`, after every sample of a round is in (settle=False defers it), so when
        several nodes qualify at once the sickest is cordoned first."""
        tr = self._track(e.node)
        tr.last_time = e.time
        self._sync(tr, current, e.time)
        if tr.keys is None:
            skip = (*NOT_MODELLED, *self.config.ignore)
            keys = [k for k in e.values if not any(fnmatch.fnmatch(k, p) for p in skip)]
            if not any(k.startswith("node_") for k in keys):
                keys += [k for k in PEER_FALLBACK if k in e.values and k not in keys]
            tr.keys = sorted(keys)
        row = np.asarray([float(e.values.get(k, 0.0)) for k in tr.keys], dtype=np.float32)
        tr.rows.append(row)
        tr.times.append(e.time)
        if self.tap is not None:
            self.tap(e.node, tr.keys, row, e.time)
        with self._lock:
            det, spot = tr.detector, tr.spot
        if det is None or spot is None or len(tr.rows) < det.config.history + det.config.target:
            self._learn(e.node, tr, row)
            return None
        need = det.config.history + det.config.target + det.config.smooth - 1
        window = np.stack(list(tr.rows)[-need:])
        raw = det.window_nll(window)
        score = float(smooth_scores(raw, det.config.smooth, det.config.decay)[-1])
        tr.last_score, tr.scored, tr.scored_at = score, tr.scored + 1, e.time
        alarm = spot.step(score)
        if not alarm:
            # A sample over the threshold is not learned as healthy, even when its alarm is
            # held below (a scheduling change explains it): held samples are transients —
            # jobs arriving from a cordoned neighbour, that neighbour's disk storm felt
            # through the shared disk — and in the seed-4 campaign a refit that learned such
            # samples (scores up to ~350) came with a threshold of 2,808 for ten minutes.
            self._learn(e.node, tr, row)
        why = ""
        if alarm:
            if tr.last_alarm_at is None or e.time - tr.last_alarm_at > self.config.run_gap_s:
                tr.explained_until = tr.grace_until  # a new run of alarms: which changes came before it
            tr.last_alarm_at = e.time
        if alarm and e.time < tr.explained_until:
            tr.held += 1
            alarm = False  # explained by the scheduling change: scored, not counted
        if alarm:
            tr.alarms += 1
            tr.severity.append(score / max(abs(spot.threshold), 1e-9))
            # Attributed to the least likely of the windows the score averages, not the newest:
            # an alarm just after a fault ends has a smoothed score still over the threshold
            # and a newest sample at its healthy means, which explained nothing (opswalk s31).
            back = len(raw) - 1 - int(np.argmax(raw))
            worst = window[: len(window) - back]
            shares = det.attribute(worst)
            why = describe(score, spot.threshold, shares, self.config.top_n)
            tr.last_reason = why
            # float32 rows: 97.3 read 97.30000305175781; seven digits are what a float32 holds.
            values = {k: float(f"{v:.7g}") for k, v in zip(tr.keys or [], worst[-1].tolist(), strict=True)}
            tr.why = explain(e.time, score, spot.threshold, shares, det, values, self.config.top_n + 2)
            tr.why["sample_time"] = list(tr.times)[-1 - back]
        t = tr.machine.observe(e.time, alarm, why, may_cordon=False)
        if t is not None:
            self._apply(t)
        if settle:
            t = self.settle(e.time).get(e.node, t)
        return t

    def settle(self, now: float) -> dict[str, Transition]:
        """Cordon qualifying nodes, sickest (highest recent score/threshold) first, within the
        cap. `observe` calls it once a round; a caller feeding `score(settle=False)` by hand
        (a replay) calls it after each round's samples."""
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
        return cordoned + 1 <= int(self.config.max_cordoned_fraction * len(self.nodes))

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
        if t.old == NodeHealth.HEALTHY and t.new != NodeHealth.HEALTHY and t.node in self.nodes:
            self._leave_healthy(self.nodes[t.node])
        log.info("node %s: %s -> %s (%s)", t.node, t.old, t.new, t.reason)
        self._outbox.append(SetNodeHealth(t.node, t.new, t.reason, by="detector"))

    # ------------------------------------------------------------------ models
    def _learn(self, node: str, tr: NodeTrack, row: np.ndarray) -> None:
        """Keep healthy samples and (re)fit the node's model when it is due."""
        if tr.machine.state != NodeHealth.HEALTHY:
            return
        tr.healthy.append(row)
        tr.fresh += 1
        if tr.training is not None and tr.training.is_alive():
            return
        cfg = self.config
        if tr.detector is None:
            due = len(tr.healthy) >= cfg.train_samples
        elif cfg.retrain_growth <= 1.0:
            due = False
        else:
            # Loaded models start the count from the samples seen since (trained_on = 0).
            base = max(tr.trained_on, cfg.train_samples)
            due = tr.fresh >= min(base * (cfg.retrain_growth - 1.0), cfg.history_samples)
        if due:
            self._fit(node, tr)

    def _leave_healthy(self, tr: NodeTrack) -> None:
        """The samples that led up to an alarm are not healthy history: drop them (the cordon
        window's worth at one sample a second, plus the score smoothing)."""
        drop = min(int(self.config.rules.cordon_window_s) + self.config.detector.smooth, len(tr.healthy))
        for _ in range(drop):
            tr.healthy.pop()
        tr.fresh = max(0, tr.fresh - drop)

    def _fit(self, node: str, tr: NodeTrack) -> None:
        data = np.stack(list(tr.healthy))
        keys = list(tr.keys or [])
        tr.fresh = 0

        def work() -> None:
            # Learning is background work, so this thread runs a little below the control
            # plane (nice +FIT_NICENESS, this thread only). Not at the lowest priority: on a
            # machine whose cores are all busy a nice-19 thread gets ~1.5 % of a core, and
            # while it holds the GIL every other thread of the control plane waits for it
            # (CI saw a node model still unfitted after 150 s; the rounds stalled with it).
            with contextlib.suppress(OSError, AttributeError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), FIT_NICENESS)
            det = FlowDetector(self.config.detector)
            try:
                report = det.fit(data, keys)
            except Exception:  # a refit that fails keeps the model that works
                log.exception("node %s: fitting on %d samples failed", node, len(data))
                return
            spot = make_threshold(self.config, det.calibration)
            if self.config.models_dir is not None:
                self.config.models_dir.mkdir(parents=True, exist_ok=True)
                det.save(self.config.models_dir / f"{node}.pt")
            with self._lock:
                tr.detector, tr.spot, tr.trained_on = det, spot, len(data)
                tr.fits += 1
            log.info(
                "node %s: model fitted on %d samples in %.1fs (%d epochs), threshold %.2f",
                node,
                len(data),
                report.seconds,
                report.epochs,
                spot.threshold,
            )

        if self.config.background:
            thread = threading.Thread(target=work, name=f"health-fit-{node}", daemon=True)
            thread.start()  # started before it is published, so wait_ready() never joins an unstarted thread
            tr.training = thread
        else:
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
        judged = [k for k in det.kpis if any(fnmatch.fnmatch(k, p) for p in NOT_MODELLED)]
        if judged:  # saved by an older sluice, which judged what a job reports
            log.warning("node %s: the saved model judges %s; learning a new model", node, ", ".join(judged))
            return
        tr.detector, tr.keys = det, list(det.kpis)
        tr.spot = make_threshold(self.config, det.calibration)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait for every node's model fitting to finish (tests, `sluice demo`)."""
        for tr in self.nodes.values():
            if tr.training is not None:
                tr.training.join(timeout)
        return all(tr.detector is not None for tr in self.nodes.values())

    @staticmethod
    def _state(tr: NodeTrack) -> str:
        """learning: no model yet, nothing is scored; refitting: a newer model is being fitted
        while the old one scores; scoring. `node why` showed a blank or an old score with no
        word of which (walkthrough 4)."""
        if tr.detector is None or tr.spot is None:
            return "learning"
        if tr.training is not None and tr.training.is_alive():
            return "refitting"
        return "scoring"

    def status(self) -> dict[str, dict[str, object]]:
        """Per node: state, reason, whether a model is ready, last score and threshold."""
        return {
            n: {
                "health": str(tr.machine.state),
                "reason": tr.machine.reason,
                "model": tr.detector is not None,
                "samples": len(tr.rows),
                "state": self._state(tr),
                "healthy_samples": len(tr.healthy),
                "train_samples": self.config.train_samples,
                "score": tr.last_score,
                "scored_at": tr.scored_at,
                "threshold": tr.spot.threshold if tr.spot else float("nan"),
                "alarms": tr.alarms,
                "held": tr.held,
                "scored": tr.scored,
                "fits": tr.fits,
                "trained_on": tr.trained_on,
                "why": dict(tr.why),
            }
            for n, tr in self.nodes.items()
        }


def explain(
    time: float,
    score: float,
    threshold: float,
    shares: dict[str, float],
    det: FlowDetector,
    values: dict[str, float],
    n: int,
) -> dict[str, object]:
    """One alarm's attribution as data: the `n` KPIs with the largest share, each with its
    value in the alarm's sample and the healthy mean and spread the node's model learned, so an
    operator reads "node_cpu_other_pct 97 (healthy 0 ± 2)" rather than a bare share."""
    kpis = []
    for name, share in sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))[:n]:
        row: dict[str, float | str] = {"kpi": name, "share": round(share, 4), "value": float(values.get(name, 0.0))}
        if det.scaler is not None and name in det.kpis:
            i = det.kpis.index(name)
            row["healthy_mean"] = float(det.scaler.mean[i])
            row["healthy_spread"] = float(det.scaler.scale[i])
        kpis.append(row)
    return {"time": time, "score": score, "threshold": threshold, "kpis": kpis}


CEILING_SPREADS = 10.0
"""The threshold stays below the largest healthy calibration score plus this many spreads
(see `_spot`)."""

MIN_SPREAD_NATS = 5.0
"""The smallest spread `_spot` allows (nats of window negative log-likelihood): a window
e^5 ≈ 150 times less likely than the least likely healthy one is the least a threshold asks.
Why a bound: a node that sat idle while its model learned scores every healthy window alike,
so the largest and median calibration scores differ by hundredths, and a 0.3 % I/O stall put
its score 0.1 nats over such a threshold (seed-3 campaign: node-1 went Suspect on that, and
only the cordon cap kept it in service). Healthy scores there never passed their threshold
by more than 4.5 nats; a fault's scores sat 670 or more above it."""


def _spot(q: float, calibration: np.ndarray) -> Spot:
    """SPOT on the held-out healthy scores, kept between the largest healthy score plus one
    spread and that score plus `CEILING_SPREADS` spreads, where the spread is the largest
    score's distance from the median (at least `MIN_SPREAD_NATS`).

    Why bounds on every calibration, long ones included: extrapolating a GPD to q = 1e-3
    from a few hundred scores (a handful of excesses) can put the threshold anywhere. A
    dozen scores from a calm node gave 1e20 (the e2e test); in the seed-3 campaign a refit
    on 1,186 healthy samples (411 calibration scores, −8.3 … 39) gave 3,797, above every
    fault score of the run, and streaming SPOT then took a CPU fault's scores (1,000-5,000)
    for healthy peaks and learned them, until its threshold reached 2.8e13 and the node's
    next two faults went unseen. Under the ceiling a fault's scores stay alarms, and alarms
    are never learned, so the threshold cannot run away. The floor keeps a healthy score
    seen in calibration from ever alarming."""
    return _bounded(Spot(q=q, level=_level(len(calibration))), calibration).fit(calibration)


def _bounded(spot: Spot, scores: np.ndarray) -> Spot:
    """Set `spot`'s floor and ceiling from the scores it will be fitted on (see `_spot`)."""
    finite = scores[np.isfinite(scores)]
    if len(finite) > 0:
        top, mid = float(np.max(finite)), float(np.median(finite))
        spread = max(top - mid, MIN_SPREAD_NATS)
        spot.floor = top + spread
        spot.ceiling = top + CEILING_SPREADS * spread
    return spot


MIN_DSPOT_DEPTH = 10
"""The shortest level DSPOT is used with (scores): below it, a level is one or two scores
and follows noise, so a calibration under twice this gets the bounded SPOT instead."""


def _dspot(q: float, depth: int, calibration: np.ndarray) -> DSpot | Spot:
    """DSPOT with the same bounds as `_spot`, set on the calibration's excesses over their
    running level instead of the scores: an excess is never alarmed on below the largest
    healthy excess plus a spread, and always above it plus ten. A calibration too short for
    a level of `MIN_DSPOT_DEPTH` scores gets the plain bounded SPOT."""
    if int(np.isfinite(calibration).sum()) < 2 * MIN_DSPOT_DEPTH:
        return _spot(q, calibration)
    ex, depth = DSpot.excesses(calibration, depth)
    return DSpot(_bounded(Spot(q=q, level=_level(len(ex))), ex), depth).fit(calibration)


def make_threshold(config: MonitorConfig, calibration: np.ndarray) -> Spot | DSpot:
    """The node's alarm threshold as `config.threshold` asks (`spot` or `dspot`)."""
    if config.threshold == "dspot":
        return _dspot(config.q, config.dspot_depth, calibration)
    return _spot(config.q, calibration)


def _level(n: int) -> float:
    """Initial SPOT quantile: 0.98 when there are enough calibration scores to leave a tail
    of excesses to fit; lower on a short healthy history so some peaks remain."""
    return min(0.98, max(0.8, 1.0 - 10.0 / max(n, 1)))


OnTransition = Callable[[Transition], None]
