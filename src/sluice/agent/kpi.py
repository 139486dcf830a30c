"""Node KPI sampling for the health detector: one sample a second, kept as a bounded window.

Why per-core deltas computed here rather than `psutil.cpu_percent`: psutil keeps one
"since last call" state per process, so two virtual nodes sampled in the same agent process
would steal each other's intervals. Each sampler keeps its own previous counters and reads
its node's cores (its cpuset); memory, swap, disk, network and context switches are
machine-wide (virtual nodes share them, as containers on one host do).

A node that holds only some of the machine's cores (a virtual node) also reports
`peer_excess_cpu_*_pct`: how much more busy/user/nice/system/iowait/steal time its cores show
than the machine's other cores. Load that floats over every core — unpinned processes, other
tenants of a shared machine — moves both sides alike and cancels; a fault on the node's own
cores does not (peer comparison, as fleets compare a node with its peers).

Given the node's own cgroups (`NodeGroups`), it also reports `node_*` KPIs read from the
kernel's counters for the processes the node runs (its jobs and faults injected there), not
for the machine: CPU used (and the share of it *not* used by the node's jobs), kernel time,
throttling, memory held, limit hits, major faults, block I/O, and the share of time its
processes stalled on CPU, memory or I/O (PSI). See `node_rates` for each one.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psutil

from sluice.agent.node_cgroup import NodeGroups, read_counters
from sluice.model import Event, JobProgress

_MB = 1024.0 * 1024.0


def _gpu_reader(ids: Sequence[str] | None = None) -> Callable[[], dict[str, float]] | None:
    """NVML metrics of the GPUs `ids` names (NVML indices; None: every GPU of the machine),
    keyed `gpu<id>_*`, where a GPU and the nvidia-ml bindings exist; None elsewhere. A node
    reads only its own GPUs: a busy GPU of another virtual node is not this one's. A MIG
    instance (a `MIG-...` id) is not read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        wanted = [str(i) for i in range(count)] if ids is None else [g for g in ids if g.isdigit() and int(g) < count]
        handles = [(g, pynvml.nvmlDeviceGetHandleByIndex(int(g))) for g in wanted]
    except Exception:  # no driver, no library, no device: no GPU KPIs
        return None
    if not handles:
        return None

    def read() -> dict[str, float]:
        out: dict[str, float] = {}
        for i, h in handles:
            with contextlib.suppress(Exception):
                util = pynvml.nvmlDeviceGetUtilizationRates(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                out[f"gpu{i}_util_pct"] = float(util.gpu)
                out[f"gpu{i}_mem_pct"] = 100.0 * float(mem.used) / max(float(mem.total), 1.0)
                out[f"gpu{i}_temp_c"] = float(pynvml.nvmlDeviceGetTemperature(h, 0))
        return out

    return read


_CORE_KEYS = ("busy", "user", "nice", "system", "iowait", "steal")


def _core_pcts(a: Any, b: Any) -> dict[str, float]:
    """One core's shares of the interval (percent) from two psutil cpu_times readings."""
    total = max(sum(a) - sum(b), 1e-9)

    def pct(field: str) -> float:
        return max(0.0, 100.0 * (getattr(a, field, 0.0) - getattr(b, field, 0.0)) / total)

    idle = pct("idle") + pct("iowait")
    out = {k: pct(k) for k in _CORE_KEYS if k != "busy"}
    out["busy"] = max(0.0, 100.0 - idle)
    return out


def _mean(rows: list[dict[str, float]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows) if rows else 0.0


def per_job_throughput(steps_ps: float, jobs: int) -> float:
    """log(1 + steps/s per running job): the node's job throughput in a form the detector can
    model across job mixes. Raw steps/s jumps by orders of magnitude when the scheduler starts
    a fast job (an MLP) next to a slow one (a CNN) — a change the control plane made, not a
    sick node — while a hog that halves every job's speed moves the log by the same amount
    whatever the mix. No job: 0."""
    return math.log1p(max(steps_ps, 0.0) / jobs) if jobs > 0 else 0.0


def node_rates(
    cur: dict[str, float], prev: dict[str, float], dt: float, cores: int, memory_mb: float, last_other: float
) -> dict[str, float]:
    """The node's cgroup KPIs from two readings of `read_counters` `dt` seconds apart.

    node_cpu_used_pct      CPU the node's processes used, % of the node's cores
    node_cpu_other_pct     of which not by its jobs (faults, anything else put in the node)
    node_cpu_system_pct    kernel time of the node's processes, % of its cores
    node_cpu_throttled_pct time its jobs were held back by their CPU limits, % of a second
    node_mem_used_pct      memory the node's processes hold (page cache included), % of the
                           node's memory
    node_mem_limit_hits_ps, node_mem_majfaults_ps
    node_io_read_mbps, node_io_write_mbps, node_io_ops_ps   block I/O the node issued
    node_psi_{cpu,memory,io}_pct, node_psi_{memory,io}_full_pct   share of the second in which
                           some (all) of the node's runnable processes waited for that resource
    node_net_tx_mbps, node_net_tx_pps   network egress of the node's processes (nft: v1 net_cls or v2 groups)
    node_net_other_tx_mbps of which not by its jobs (faults, anything else put in the node)
    node_net_rx_mbps, node_net_rx_pps, node_net_other_rx_mbps   the same for what they
                           received (v2 groups only: node_net.NodeNetV2)

    `node_cpu_other_pct` is usage minus the sum over job cgroups; a job whose cgroup vanished
    between the readings took its last slice with it, so that sample repeats `last_other`."""
    out: dict[str, float] = {}
    cores = max(cores, 1)

    def rate(key: str) -> float | None:
        if key not in cur or key not in prev:
            return None
        return max(0.0, (cur[key] - prev[key]) / dt)

    used = rate("cpu_s")
    if used is not None:
        out["node_cpu_used_pct"] = 100.0 * used / cores
        out["node_cpu_system_pct"] = 100.0 * (rate("cpu_system_s") or 0.0) / cores
        jobs_now = {k for k in cur if k.startswith("job:")}
        jobs_before = {k for k in prev if k.startswith("job:")}
        if jobs_before - jobs_now:
            out["node_cpu_other_pct"] = last_other
        else:
            # A job new since the last reading used all of its counter within the interval.
            jobs = sum(max(0.0, cur[k] - prev.get(k, 0.0)) for k in jobs_now) / dt
            out["node_cpu_other_pct"] = max(0.0, 100.0 * (used - jobs) / cores)
        out["node_cpu_throttled_pct"] = 100.0 * (rate("cpu_throttled_s") or 0.0)
    if "mem_bytes" in cur:
        out["node_mem_used_pct"] = 100.0 * cur["mem_bytes"] / (max(memory_mb, 1.0) * _MB)
        out["node_mem_limit_hits_ps"] = rate("mem_limit_hits") or 0.0
        out["node_mem_majfaults_ps"] = rate("mem_majfaults") or 0.0
    if "io_ops" in cur:
        out["node_io_read_mbps"] = (rate("io_read_bytes") or 0.0) / _MB
        out["node_io_write_mbps"] = (rate("io_write_bytes") or 0.0) / _MB
        out["node_io_ops_ps"] = rate("io_ops") or 0.0
    for res in ("cpu", "memory", "io"):
        if f"psi_{res}_some_s" in cur:
            out[f"node_psi_{res}_pct"] = min(100.0, 100.0 * (rate(f"psi_{res}_some_s") or 0.0))
        if f"psi_{res}_full_s" in cur:
            out[f"node_psi_{res}_full_pct"] = min(100.0, 100.0 * (rate(f"psi_{res}_full_s") or 0.0))
    if "net_tx_bytes" in cur and "net_tx_bytes" in prev:
        # An ended job's rule is deleted with its bytes kept in the node's total
        # (node_net.NodeNet), so the counters only grow; the other traffic is the node rule's
        # own counter (a packet carries one class id).
        out["node_net_tx_mbps"] = (rate("net_tx_bytes") or 0.0) / _MB
        out["node_net_tx_pps"] = rate("net_tx_packets") or 0.0
        out["node_net_other_tx_mbps"] = (rate("net_other_tx_bytes") or 0.0) / _MB
    if "net_rx_bytes" in cur and "net_rx_bytes" in prev:
        out["node_net_rx_mbps"] = (rate("net_rx_bytes") or 0.0) / _MB
        out["node_net_rx_pps"] = rate("net_rx_packets") or 0.0
        out["node_net_other_rx_mbps"] = (rate("net_other_rx_bytes") or 0.0) / _MB
    return out


class KpiSampler:
    """`sample()` returns one dict of KPIs (rates are per second since the previous sample;
    the first sample's rates are 0) and appends it to `window` (the newest `window_size`).
    `sample(jobs=n)` also reports `jobs` and the per-job throughput `job_steps_log_per_job`.
    `groups`: the node's own cgroups, for the `node_*` KPIs (`node_rates`); `memory_mb`: the
    node's memory, their scale."""

    def __init__(
        self,
        cpus: Sequence[int] | None = None,
        window_size: int = 600,
        gpus: bool | Sequence[str] = True,
        clock: Callable[[], float] = time.monotonic,
        groups: NodeGroups | None = None,
        memory_mb: float | None = None,
    ) -> None:
        self.groups = groups
        self.memory_mb = float(memory_mb or psutil.virtual_memory().total / _MB)
        self._prev_node = read_counters(groups) if groups is not None else {}
        self._other = 0.0
        self.cpus = sorted(cpus) if cpus is not None else sorted(os.sched_getaffinity(0))
        self.window: deque[tuple[float, dict[str, float]]] = deque(maxlen=window_size)
        self._clock = clock
        if isinstance(gpus, bool):
            self._gpu = _gpu_reader() if gpus else None
        else:  # the node's own GPUs
            self._gpu = _gpu_reader(list(gpus)) if gpus else None
        self._steps = 0
        self._last_step: dict[str, int] = {}
        self._prev_t = clock()
        self._prev_cpu = self._cpu_times()
        self._prev_counters = self._counters()

    # -------------------------------------------------------------- raw counters
    def _cpu_times(self) -> list[Any]:
        """Every core's times: the node's cores first-class, the others as its peers."""
        return list(psutil.cpu_times(percpu=True))

    @staticmethod
    def _counters() -> dict[str, float]:
        out: dict[str, float] = {}
        d = psutil.disk_io_counters()
        if d is not None:
            out.update(
                disk_read_mbps=d.read_bytes / _MB,
                disk_write_mbps=d.write_bytes / _MB,
                disk_read_iops=float(d.read_count),
                disk_write_iops=float(d.write_count),
                disk_busy_pct=float(getattr(d, "busy_time", 0)) / 10.0,  # ms → % of a second
            )
        n = psutil.net_io_counters()
        if n is not None:
            out.update(
                net_rx_mbps=n.bytes_recv / _MB,
                net_tx_mbps=n.bytes_sent / _MB,
                net_rx_pps=float(n.packets_recv),
                net_tx_pps=float(n.packets_sent),
            )
        s = psutil.cpu_stats()
        out.update(ctx_switches_ps=float(s.ctx_switches), interrupts_ps=float(s.interrupts))
        sw = psutil.swap_memory()
        out.update(swap_in_mbps=sw.sin / _MB, swap_out_mbps=sw.sout / _MB)
        return out

    # -------------------------------------------------------------- job throughput
    def observe(self, events: Iterable[Event]) -> None:
        """Count training steps the node's jobs reported (job throughput on the node)."""
        for e in events:
            if isinstance(e, JobProgress):
                last = self._last_step.get(e.job_id)
                if last is not None and e.step > last:
                    self._steps += e.step - last
                self._last_step[e.job_id] = e.step

    # -------------------------------------------------------------- sample
    def sample(self, jobs: int | None = None) -> dict[str, float]:
        now = self._clock()
        dt = max(now - self._prev_t, 1e-6)
        cpu = self._cpu_times()
        values: dict[str, float] = {}
        per = [_core_pcts(a, b) for a, b in zip(cpu, self._prev_cpu, strict=False)]
        mine = set(self.cpus)
        own = [p for c, p in enumerate(per) if c in mine]
        peers = [p for c, p in enumerate(per) if c not in mine]
        for j, p in enumerate(own):
            values[f"cpu{j}_busy_pct"] = p["busy"]
        for key in _CORE_KEYS:
            level = _mean(own, key)
            values[f"cpu_{key}_pct"] = level
            if peers:
                # How much more this node's cores do than the machine's other cores: load that
                # floats over every core (unpinned processes, other tenants) cancels out, a
                # fault on this node's cores does not. One-sided, so a sick sibling does not
                # make this node look odd by comparison.
                values[f"peer_excess_cpu_{key}_pct"] = max(0.0, level - _mean(peers, key))
        counters = self._counters()
        for key, v in counters.items():
            values[key] = max(0.0, (v - self._prev_counters.get(key, v)) / dt)
        machine_cores = psutil.cpu_count() or 1
        values["load1_per_core"] = os.getloadavg()[0] / machine_cores
        vm = psutil.virtual_memory()
        values["mem_used_pct"] = float(vm.percent)
        values["swap_used_pct"] = float(psutil.swap_memory().percent)
        values["job_steps_ps"] = self._steps / dt
        if jobs is not None:
            values["jobs"] = float(jobs)
            values["job_steps_log_per_job"] = per_job_throughput(self._steps / dt, jobs)
        if self.groups is not None:
            node = read_counters(self.groups)
            values.update(node_rates(node, self._prev_node, dt, len(self.cpus), self.memory_mb, self._other))
            self._other = values.get("node_cpu_other_pct", 0.0)
            self._prev_node = node
        if self._gpu is not None:
            values.update(self._gpu())
        self._steps = 0
        self._prev_t, self._prev_cpu, self._prev_counters = now, cpu, counters
        self.window.append((now, values))
        return values
