"""Prometheus metrics of the control plane, read from its state at scrape time (docs/metrics.md).

Why a collector and not counters sprinkled through the code: nearly everything worth a graph
(jobs, queues, nodes, health scores) is state the control plane already holds, so reading it
when Prometheus asks is never stale and adds no code to the hot paths. The few things that
are *events* rather than state (round durations, the nodes' latest KPIs, the jobs' dataset
cache counters, which jobs just finished) are taken by one round observer, which runs once
per reconcile round and only reads.

Who sees what (tenant isolation): without a token a scrape gets only cluster-wide series
(jobs by phase, decisions, round times, nodes), as /metrics served before. Series that name
jobs, tenants, queues or datasets need a bearer token: the `metrics_token` setting or an admin
tenant's token sees every tenant; a tenant's own token sees only its own jobs, tenant,
datasets and the queues granted to it. An unknown token is a 401.

Cardinality: job series cover every unfinished job plus the newest
`settings.metrics_recent_finished` finished ones (default 50); node KPIs come from a fixed
list; decision reasons are fixed classes (controller.REASON_CLASSES), never free text; dataset
series are limited to datasets a job actually mounts.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sluice.control.plane import ControlPlane
from sluice.data.cache import cache_key
from sluice.health.monitor import HealthMonitor
from sluice.model import (
    ClusterView,
    Event,
    JobProgress,
    JobRecord,
    NodeDecision,
    NodeHealth,
    NodeKPIs,
    Phase,
    dataset_of,
)
from sluice.model.progress import ProgressSignals

ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

NODE_KPIS = (
    "cpu_busy_pct",
    "mem_used_pct",
    "swap_used_pct",
    "load1_per_core",
    "disk_busy_pct",
    "net_rx_mbps",
    "net_tx_mbps",
    "job_steps_ps",
    "node_cpu_used_pct",
    "node_cpu_other_pct",
    "node_mem_used_pct",
    "node_psi_memory_pct",
    "node_psi_io_pct",
)
"""The node KPIs exported (of the many the agents sample): a fixed list keeps the label bounded."""

GPU_KPI = re.compile(r"gpu\d{1,2}_(util_pct|mem_pct|temp_c)")
"""And each of the node's own GPUs' utilisation, memory used and temperature (NVML, where the
node has GPUs): at most 64 GPUs a node (the spec's bound), three KPIs each."""

DASH_KPIS = ("cpu_busy_pct", "mem_used_pct", "peer_excess_cpu_system_pct", "peer_excess_cpu_iowait_pct")
"""The KPIs kept as a short history per node for the dashboard's sparklines (the peer-excess
shares only where the node shares its machine with other nodes' cores)."""
KPI_HISTORY = 300
"""Samples kept per node (about five minutes at the agents' default of one a second)."""
ROUND_HISTORY = 200
"""Reconcile round times kept for the latency summary (GET /v1/cluster/stats)."""
ALLOC_HISTORY = 300
ALLOC_EVERY_S = 2.0
"""Cluster allocation samples: one every 2 s at most, 300 of them (ten minutes)."""

CACHE_PREFIX = "cache:"
"""Progress-record metric keys `cache:<owner/name>:<counter>` (sluice.sdk.dataset.CACHE_METRIC)."""
CACHE_COUNTERS = ("hits_memory", "hits_disk", "misses")
MAX_CACHE_COUNT = 2**53
"""Most a per-dataset cache counter counts (exact as a float). The counters are the jobs' own
reports: a report past it is not a count and is skipped, and a total stops at it, so that no
job can sum a counter past a float's range and fail every scrape that sees it (sdkwalk, s32)."""

DATASET_PRUNE_S = 60.0
"""How often the dataset counters of datasets deleted since are dropped (seconds): they were
kept for the plane's lifetime, so a tenant that created, read and deleted datasets in a loop
grew /metrics and the plane's memory without end (ops walk s31)."""


@dataclass(frozen=True)
class Scope:
    """Whose series a scrape may read: `everyone` (metrics or admin token), one `tenant`
    (that tenant's token), or neither (no token: cluster-wide series only)."""

    everyone: bool = False
    tenant: str | None = None

    @property
    def tenant_series(self) -> bool:
        return self.everyone or self.tenant is not None

    def sees(self, tenant: str) -> bool:
        return self.everyone or tenant == self.tenant


PUBLIC = Scope()
EVERYONE = Scope(everyone=True)


WAITING_PHASES = frozenset({Phase.PENDING.value, Phase.QUEUED.value, Phase.SUSPENDED.value})
"""Phases of a job that waits: it shows `sluice_job_info`, and its progress once it has some."""


@dataclass(frozen=True)
class JobSample:
    """One job's values for the per-job series (a finished job keeps its last ones)."""

    id: str
    tenant: str
    queue: str
    phase: str
    cpu_request: float
    cpu_limit: float | None
    cpu_used: float
    steps_per_s: float
    loss: float | None
    step: int
    restarts: int
    replicas: int


def sample_job(job: JobRecord, progress: ProgressSignals | None) -> JobSample:
    alloc = job.allocation if job.phase.active else None
    limits = [a.cpu_limit for a in alloc.assignments] if alloc else []
    used = progress.usage_history[-1][1] if progress and progress.usage_history else 0.0
    loss = progress.loss if progress and progress.loss is not None else job.loss
    return JobSample(
        id=job.id,
        tenant=job.tenant,
        queue=job.spec.queue,
        phase=str(job.phase),
        cpu_request=float(sum(a.cpu_request for a in alloc.assignments)) if alloc else 0.0,
        cpu_limit=None if None in limits else float(sum(x for x in limits if x is not None)),
        cpu_used=used if job.phase.active else 0.0,
        steps_per_s=progress.throughput if progress and job.phase.active else 0.0,
        loss=loss,
        step=job.step,  # the newest attempt's furthest step (ProgressTracker.attempt_step)
        restarts=job.restarts,
        replicas=alloc.replicas if alloc else 0,
    )


class PlaneMetrics:
    """The collector (state read at scrape time) and the round observer (the few events)."""

    def __init__(self, plane: ControlPlane, hist: Histogram) -> None:
        self.plane = plane
        self.hist = hist
        self.recent_max = plane.settings.metrics_recent_finished
        self._mu = threading.Lock()
        self._seen_rounds = int(plane.controller.rounds)
        self._kpis: dict[str, dict[str, float]] = {}
        self._kpi_history: dict[str, deque[tuple[float, dict[str, float]]]] = {}
        """node -> its last KPI_HISTORY samples of DASH_KPIS (time, values), oldest first."""
        self._round_times: deque[float] = deque(maxlen=ROUND_HISTORY)
        self._alloc: deque[tuple[float, float, float]] = deque(maxlen=ALLOC_HISTORY)
        """(time, cores requested by active jobs, cluster cores), oldest first."""
        self._cache: Counter[tuple[str, str]] = Counter()
        """(dataset cache key, counter) -> total over every job attempt so far."""
        self._cache_last: dict[tuple[str, int, str], float] = {}
        """(job, attempt, metric key) -> the cumulative value last reported (to take deltas)."""
        self._pruned_at: float | None = None
        self._live: set[str] = set()
        self._recent: OrderedDict[str, JobSample] = OrderedDict()
        """The newest finished jobs, oldest first, at most `recent_max`."""

    # ------------------------------------------------------------------ round observer

    def observe(self, view: ClusterView, events: Sequence[Event]) -> list[NodeDecision]:
        """Called inside round N+1 (under the controller's lock), where the controller's
        round_seconds is round N's time. Never asks for anything."""
        ctl = self.plane.controller
        if ctl.rounds > self._seen_rounds:
            self._seen_rounds = ctl.rounds
            self.hist.observe(float(ctl.round_seconds))
            with self._mu:
                self._round_times.append(float(ctl.round_seconds))
        live = set(ctl.book.live_ids())
        with self._mu:
            self._sample_allocation(view)
            for e in events:
                if isinstance(e, NodeKPIs):
                    self._kpis[e.node] = {
                        k: float(v) for k, v in e.values.items() if k in NODE_KPIS or GPU_KPI.fullmatch(k)
                    }
                    ring = self._kpi_history.setdefault(e.node, deque(maxlen=KPI_HISTORY))
                    ring.append((e.time, {k: float(e.values[k]) for k in DASH_KPIS if k in e.values}))
                elif isinstance(e, JobProgress) and any(k.startswith(CACHE_PREFIX) for k in e.metrics):
                    self._count_cache(e, self._mounted(view, e.job_id))
            for job_id in self._live - live:
                job = ctl.book.get(job_id)
                if job is not None and job.phase.terminal:
                    self._recent[job_id] = sample_job(job, None)
                    self._recent.move_to_end(job_id)
            while len(self._recent) > self.recent_max:
                self._recent.popitem(last=False)
            self._live = live
            self._cache_last = {k: v for k, v in self._cache_last.items() if k[0] in live}
            for gone in set(self._kpi_history) - set(view.nodes):  # a node that left: forget it
                del self._kpi_history[gone]
        self._prune_datasets(view.now)
        return []

    def _prune_datasets(self, now: float) -> None:
        """Drop the counters of datasets that no longer exist, every DATASET_PRUNE_S: one read of
        the datasets, only while some are counted. A dataset made again under its name counts
        from 0, as a counter does after a restart."""
        if self._pruned_at is not None and now - self._pruned_at < DATASET_PRUNE_S:
            return
        self._pruned_at = now
        with self._mu:
            counted = {ds for ds, _ in self._cache}
        if not counted:
            return
        exist = {cache_key(d.tenant, d.name) for d in self.plane.store.list_datasets()}
        with self._mu:
            for key in [k for k in self._cache if k[0] not in exist]:
                del self._cache[key]

    def _sample_allocation(self, view: ClusterView) -> None:
        """Cores requested against cluster cores, at most every ALLOC_EVERY_S: a server-side
        history, so the overview's timeline is full as soon as the page opens."""
        if self._alloc and view.now - self._alloc[-1][0] < ALLOC_EVERY_S:
            return
        requested = sum(
            a.cpu_request
            for j in view.jobs.values()
            if j.phase.active and j.allocation
            for a in j.allocation.assignments
        )
        self._alloc.append((view.now, float(requested), float(sum(n.cpu for n in view.nodes.values()))))

    # ------------------------------------------------------------------ dashboard reads

    def kpi_history(self, node: str) -> list[dict[str, object]]:
        """The node's recent KPI samples, oldest first (at most KPI_HISTORY)."""
        with self._mu:
            ring = list(self._kpi_history.get(node, ()))
        return [{"time": t, "values": dict(v)} for t, v in ring]

    def cache_counts(self, dataset: str) -> dict[str, int]:
        """Totals of one dataset's cache counters (`hits_memory`, `hits_disk`, `misses`)."""
        with self._mu:
            return {what: self._cache.get((dataset, what), 0) for what in CACHE_COUNTERS}

    def round_summary(self) -> dict[str, float | int | None]:
        """p50/p95/max of the last ROUND_HISTORY round times (seconds), and how many."""
        with self._mu:
            times = sorted(self._round_times)
        if not times:
            return {"count": 0, "p50": None, "p95": None, "max": None}

        def q(p: float) -> float:
            return times[min(len(times) - 1, int(p * len(times)))]

        return {"count": len(times), "p50": q(0.5), "p95": q(0.95), "max": times[-1]}

    def allocation_history(self) -> list[tuple[float, float, float]]:
        """(time, requested cores, cluster cores), oldest first (at most ALLOC_HISTORY)."""
        with self._mu:
            return list(self._alloc)

    def _mounted(self, view: ClusterView, job_id: str) -> set[str]:
        """The cache keys (`owner/name`) of the datasets a job mounts. A job whose last report
        arrived with its exit is no longer in the view: then from its record."""
        jv = view.jobs.get(job_id)
        if jv is not None:
            return {dataset_of(d) for d in jv.datasets}
        job = self.plane.controller.book.get(job_id)
        if job is None or not job.spec.datasets:
            return set()
        return set(self.plane.datasets.cache_keys(job.tenant, [d.name for d in job.spec.datasets]))

    def _count_cache(self, e: JobProgress, datasets: set[str]) -> None:
        """Fold a job's cumulative per-dataset cache counters into the totals; only datasets
        the job mounts are taken, so a job cannot invent label values."""
        for key, value in e.metrics.items():
            if not key.startswith(CACHE_PREFIX):
                continue
            ds, _, what = key[len(CACHE_PREFIX) :].rpartition(":")
            if ds not in datasets or what not in CACHE_COUNTERS:
                continue
            if value > MAX_CACHE_COUNT:
                continue
            last = self._cache_last.get((e.job_id, e.attempt, key), 0.0)
            if value > last:
                total = self._cache[(ds, what)] + int(value - last)
                self._cache[(ds, what)] = min(total, MAX_CACHE_COUNT)
                self._cache_last[(e.job_id, e.attempt, key)] = value

    # ------------------------------------------------------------------ collector

    def collect(self, scope: Scope = PUBLIC) -> Iterator[Metric]:
        yield from self.hist.collect()
        yield from self._cluster()
        yield from self._nodes()
        if scope.tenant_series:
            yield from self._jobs(scope)
            yield from self._tenants(scope)
            yield from self._queues(scope)
            yield from self._datasets(scope)

    def _cluster(self) -> Iterator[Metric]:
        ctl = self.plane.controller
        phases: Counter[str] = Counter(self.plane.job_counts())
        jobs = GaugeMetricFamily("sluice_jobs", "Jobs the control plane knows, by phase.", labels=["phase"])
        for phase in Phase:
            jobs.add_metric([phase.value], phases.get(phase.value, 0))
        yield jobs
        yield CounterMetricFamily("sluice_reconcile_rounds", "Reconcile rounds run since start.", value=ctl.rounds)
        decided = CounterMetricFamily(
            "sluice_decisions",
            "Decisions executed since start, by kind (refused: the engine could not).",
            labels=["kind"],
        )
        for kind, n in sorted(dict(ctl.decisions).items()):
            decided.add_metric([kind], n)
        yield decided
        by_reason = CounterMetricFamily(
            "sluice_decisions_by_reason",
            "Decisions since start by kind and reason class (policy, quota, engine_refused, detector, operator).",
            labels=["kind", "reason"],
        )
        for (kind, reason), n in sorted(dict(ctl.decision_reasons).items()):
            by_reason.add_metric([kind, reason], n)
        yield by_reason

    def _nodes(self) -> Iterator[Metric]:
        health = GaugeMetricFamily(
            "sluice_node_health", "1 for the node's current health state, 0 for the others.", labels=["node", "state"]
        )
        cores = GaugeMetricFamily("sluice_node_cpu_cores", "CPU cores the node offers.", labels=["node"])
        requested = GaugeMetricFamily(
            "sluice_node_cpu_requested_cores", "CPU cores requested by the node's active jobs.", labels=["node"]
        )
        jobs = GaugeMetricFamily("sluice_node_jobs", "Active jobs on the node.", labels=["node"])
        for n in self.plane.nodes():
            for state in NodeHealth:
                health.add_metric([n.name, state.value], 1.0 if n.health == state.value else 0.0)
            cores.add_metric([n.name], n.cpu)
            requested.add_metric([n.name], n.cpu_requested)
            jobs.add_metric([n.name], n.jobs)
        yield from (health, cores, requested, jobs)
        kpi = GaugeMetricFamily(
            "sluice_node_kpi", "The node's latest KPI sample (a fixed list; unit in the name).", labels=["node", "kpi"]
        )
        with self._mu:
            for node, values in sorted(self._kpis.items()):
                for k, v in values.items():
                    kpi.add_metric([node, k], v)
        yield kpi
        if isinstance(self.plane.health, HealthMonitor):
            score = GaugeMetricFamily(
                "sluice_node_anomaly_score", "Health detector's latest anomaly score of the node.", labels=["node"]
            )
            threshold = GaugeMetricFamily(
                "sluice_node_anomaly_threshold",
                "Score above which a sample counts as an alarm (SPOT threshold).",
                labels=["node"],
            )
            for node, st in sorted(self.plane.health.status().items()):
                for fam, key in ((score, "score"), (threshold, "threshold")):
                    val = st.get(key)
                    if isinstance(val, float) and math.isfinite(val):
                        fam.add_metric([node], val)
            yield score
            yield threshold

    def _job_samples(self, scope: Scope) -> list[JobSample]:
        ctl = self.plane.controller
        with ctl.lock:
            live = [sample_job(j, ctl.progress(j.id)) for j in ctl.book.live() if scope.sees(j.tenant)]
        live_ids = {s.id for s in live}
        with self._mu:
            recent = list(self._recent.values())
        # One read of at most metrics_recent_finished ids: a job deleted since it finished
        # (`sluice job delete`) is gone for good, here too.
        kept = self.plane.store.job_phases([s.id for s in recent]) if recent else {}
        with self._mu:
            for s in recent:
                if s.id not in kept:
                    self._recent.pop(s.id, None)
        done = [s for s in recent if s.id in kept and scope.sees(s.tenant) and s.id not in live_ids]
        return live + done

    def _jobs(self, scope: Scope) -> Iterator[Metric]:
        labels = ["job_id", "tenant", "queue"]

        def fam(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        info = GaugeMetricFamily("sluice_job_info", "1 per job, with its phase.", labels=[*labels, "phase"])
        request = fam("sluice_job_cpu_request_cores", "CPU cores the job is entitled to under contention.")
        limit = fam("sluice_job_cpu_limit_cores", "The job's CPU ceiling in cores (absent: no ceiling).")
        used = fam("sluice_job_cpu_used_cores", "CPU cores the job's processes used over the last sample.")
        speed = fam("sluice_job_steps_per_second", "Training steps per second over the recent window.")
        loss = fam("sluice_job_loss", "The job's latest reported loss.")
        step = fam("sluice_job_step", "The job's latest reported step.")
        restarts = fam("sluice_job_restarts", "Times the job was restarted after a failure.")
        replicas = fam("sluice_job_replicas", "Replicas the job runs now (0 when not placed).")
        for s in self._job_samples(scope):
            key = [s.id, s.tenant, s.queue]
            info.add_metric([*key, s.phase], 1.0)
            if s.phase in WAITING_PHASES and not s.replicas:
                # A waiting job holds nothing and runs nothing: its other series would all read
                # 0, and a tenant may keep up to max_unfinished_jobs_per_tenant (10,000) waiting.
                # One series each, plus the progress a suspended or requeued job carries.
                if s.step or s.restarts or s.loss is not None:
                    if s.loss is not None and math.isfinite(s.loss):
                        loss.add_metric(key, s.loss)
                    step.add_metric(key, s.step)
                    restarts.add_metric(key, s.restarts)
                continue
            request.add_metric(key, s.cpu_request)
            if s.cpu_limit is not None and s.replicas:
                limit.add_metric(key, s.cpu_limit)
            used.add_metric(key, s.cpu_used)
            speed.add_metric(key, s.steps_per_s)
            if s.loss is not None and math.isfinite(s.loss):
                loss.add_metric(key, s.loss)
            step.add_metric(key, s.step)
            restarts.add_metric(key, s.restarts)
            replicas.add_metric(key, s.replicas)
        yield from (info, request, limit, used, speed, loss, step, restarts, replicas)

    def _tenants(self, scope: Scope) -> Iterator[Metric]:
        running: Counter[str] = Counter()
        pending: Counter[str] = Counter()
        cores: dict[str, float] = {}
        with self.plane.controller.lock:
            live = self.plane.controller.book.live()
        for j in live:
            if j.phase.active:
                running[j.tenant] += 1
                held = sum(a.cpu_request for a in j.allocation.assignments) if j.allocation else 0.0
                cores[j.tenant] = cores.get(j.tenant, 0.0) + held
            elif j.phase in (Phase.PENDING, Phase.QUEUED):
                pending[j.tenant] += 1
        fams = {
            "running": GaugeMetricFamily("sluice_tenant_running_jobs", "The tenant's active jobs.", labels=["tenant"]),
            "pending": GaugeMetricFamily(
                "sluice_tenant_pending_jobs", "The tenant's jobs waiting (Pending or Queued).", labels=["tenant"]
            ),
            "cores": GaugeMetricFamily(
                "sluice_tenant_cpu_request_cores", "CPU cores requested by the tenant's active jobs.", labels=["tenant"]
            ),
            "limit": GaugeMetricFamily(
                "sluice_tenant_max_running_jobs", "The tenant's running-job limit (absent: none).", labels=["tenant"]
            ),
            "weight": GaugeMetricFamily("sluice_tenant_weight", "The tenant's fair-share weight.", labels=["tenant"]),
        }
        for t in self.plane.store.list_tenants():
            if not scope.sees(t.name):
                continue
            fams["running"].add_metric([t.name], running[t.name])
            fams["pending"].add_metric([t.name], pending[t.name])
            fams["cores"].add_metric([t.name], cores.get(t.name, 0.0))
            fams["weight"].add_metric([t.name], t.weight)
            if t.max_running_jobs:
                fams["limit"].add_metric([t.name], t.max_running_jobs)
        yield from fams.values()

    def _queues(self, scope: Scope) -> Iterator[Metric]:
        usage = GaugeMetricFamily(
            "sluice_queue_usage", "Quota the queue's admitted jobs hold, by resource.", labels=["queue", "resource"]
        )
        quota = GaugeMetricFamily(
            "sluice_queue_nominal_quota",
            "The queue's nominal quota, by resource (absent: none).",
            labels=["queue", "resource"],
        )
        pending = GaugeMetricFamily(
            "sluice_queue_pending_jobs", "Jobs waiting for the queue's quota.", labels=["queue"]
        )
        admitted = GaugeMetricFamily("sluice_queue_admitted_jobs", "Jobs holding the queue's quota.", labels=["queue"])
        for q in self.plane.queues.statuses(None if scope.everyone else scope.tenant):
            for r, v in sorted(q.usage.items()):
                usage.add_metric([q.name, r], v)
            for r, v in sorted(q.nominal.items()):
                quota.add_metric([q.name, r], v)
            pending.add_metric([q.name], q.pending)
            admitted.add_metric([q.name], q.admitted)
        yield from (usage, quota, pending, admitted)

    def _datasets(self, scope: Scope) -> Iterator[Metric]:
        def owned(ds: str) -> bool:
            return scope.sees(ds.partition("/")[0])

        hits = CounterMetricFamily(
            "sluice_dataset_cache_hits", "Items jobs read from the node cache, by tier.", labels=["dataset", "tier"]
        )
        misses = CounterMetricFamily(
            "sluice_dataset_cache_misses", "Items jobs had to fetch from the source.", labels=["dataset"]
        )
        with self._mu:
            counts = sorted(self._cache.items())
        for (ds, what), n in counts:
            if not owned(ds):
                continue
            if what == "misses":
                misses.add_metric([ds], n)
            else:
                hits.add_metric([ds, what.removeprefix("hits_")], n)
        held = GaugeMetricFamily(
            "sluice_dataset_cached_bytes",
            "Bytes of the dataset in the control plane host's node cache, by tier.",
            labels=["dataset", "tier"],
        )
        for (ds, tier), n in sorted(self.plane.datasets.cached_bytes_by_tier().items()):
            if owned(ds):
                held.add_metric([ds, tier], n)
        yield from (hits, misses, held)


class _Scoped:
    """What generate_latest() reads for one scrape: the collector seen through a scope."""

    def __init__(self, metrics: PlaneMetrics, scope: Scope) -> None:
        self.metrics = metrics
        self.scope = scope

    def collect(self) -> Iterable[Metric]:
        return self.metrics.collect(self.scope)


def build_metrics(plane: ControlPlane) -> PlaneMetrics:
    """The app's metrics. Each app gets its own registry for the histogram: several planes in
    one test process must not collide in prometheus_client's global one."""
    hist = Histogram(
        "sluice_reconcile_round_seconds",
        "Wall time of one reconcile round (poll, decide, act).",
        buckets=ROUND_BUCKETS,
        registry=CollectorRegistry(auto_describe=True),
    )
    metrics = PlaneMetrics(plane, hist)
    plane.controller.add_observer(metrics)
    return metrics


def scoped(metrics: PlaneMetrics, scope: Scope) -> _Scoped:
    return _Scoped(metrics, scope)
