"""One node's own cgroups: every process the node runs (its jobs, and faults injected there)
is grouped under `<root>/<node>` in each hierarchy, so the node's KPIs can be read from the
kernel's counters for that group instead of from machine-wide ones.

Why: virtual nodes (the local engine splits one machine into cpusets) share memory, disk and
network, and unpinned processes float over every core. Machine-wide KPIs cannot say which
virtual node is sick; the node's cgroup can: the CPU time its processes used (and how much of
it was not its jobs'), the memory they hold, the block I/O they issued, and — from pressure
stall information (PSI) — how long they waited for CPU, memory or I/O.

Layout (whatever is mounted and writable; what is missing is said once, and its KPIs are
simply absent):
- cgroup v1: `cpu[,cpuacct]/<root>/<node>/<job>` (job CPU limits, usage), `memory/<root>/
  <node>[/<job>]` (jobs with a memory limit get their own child), `blkio/<root>/<node>` and
  the hybrid v2 mount `unified/<root>/<node>` (PSI and cpu.stat, no controllers needed), each
  joined by the node's processes directly.
- cgroup v2: `<root>/<node>/<job>` with cpu (and memory, io where delegated) enabled below
  the node, and `<root>/<node>/faults` for faults (v2 keeps processes out of inner groups).

Block I/O on cgroup v1: recent kernels count a group's bytes and operations only once a
throttle rule is set on it, so the node's blkio group gets a rule far above any device's
speed (it never limits anything) on every block device.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sluice.agent.cgroup import SYSFS_CGROUP, CgroupKind, CgroupLayout, _enable_v2, _ensure_dir, _parent_under
from sluice.agent.node_net import NodeNet, NodeNetV2, node_net, node_net_v2

log = logging.getLogger(__name__)

FAULT_LEAF = "faults"
"""The child of a node's group that holds injected faults (where a leaf is needed): not a job."""
ACCOUNTING_BPS = 1 << 50
"""The blkio rule that turns accounting on: 1 PiB/s, far above any device (never limits)."""


@dataclass(frozen=True)
class NodeGroups:
    """Where one node's processes are grouped, per hierarchy (None: not available here).

    usage: the group with CPU usage counters (v1 cpuacct, or the v2 group); jobs are its
    children. unified: a v2 group with PSI (`*.pressure`) and cpu.stat. missing: one sentence
    per KPI family that cannot be read here, and why."""

    node: str
    layout: CgroupLayout
    """The job layout scoped to this node: job cgroups are made under the node's groups."""
    usage: Path | None = None
    usage_kind: CgroupKind | None = None
    memory: Path | None = None
    memory_kind: CgroupKind | None = None
    blkio: Path | None = None
    unified: Path | None = None
    fault_leaf: Path | None = None
    """v2: where faults go (processes may not sit in a group whose children have controllers)."""
    missing: tuple[str, ...] = ()
    net: NodeNet | NodeNetV2 | None = None
    """The node's network counters per node and job (node_net.py): its v2 groups (egress and
    ingress), or v1 net_cls groups (egress)."""

    def job_join(self, has_memory_cgroup: bool) -> tuple[str, ...]:
        """cgroup.procs files a job joins besides its own cgroups (hierarchies where jobs
        have no group of their own: v1 blkio, the hybrid unified tree, v1 memory without a
        limit)."""
        out: list[Path] = []
        if self.blkio is not None:
            out.append(self.blkio)
        if self.unified is not None and self.unified != self.usage:
            out.append(self.unified)
        if self.memory is not None and not has_memory_cgroup and self.memory_kind is CgroupKind.V1:
            out.append(self.memory)
        return tuple(str(p / "cgroup.procs") for p in out)

    def fault_join(self, cpuset: Path | None = None) -> tuple[str, ...]:
        """cgroup.procs files a fault's processes join so that the fault is the node's: its
        CPU, memory, I/O and stalls show in the node's counters (and not in any job's)."""
        dirs: list[Path | None]
        if self.fault_leaf is not None:  # v2: one leaf holds cpu, memory and io
            dirs = [self.fault_leaf, self.unified if self.unified != self.usage else None]
        else:
            dirs = [self.layout.cpu_parent, self.usage, self.memory, self.blkio, self.unified]
        dirs.append(cpuset)
        if isinstance(self.net, NodeNet) and self.net.group is not None:
            dirs.append(self.net.group)  # the node's own class id: counted as `other` traffic
        seen: list[Path] = []
        for d in dirs:
            if d is not None and d not in seen:
                seen.append(d)
        return tuple(str(d / "cgroup.procs") for d in seen)


def _v2_mount_of(path: Path, sysfs: Path) -> Path | None:
    for mount in (sysfs, sysfs / "unified"):
        if (mount / "cgroup.controllers").exists() and (path == mount or mount in path.parents):
            return mount
    return None


def _block_devices(sys_block: Path = Path("/sys/block")) -> list[str]:
    """major:minor of the machine's real block devices (no loop, ram or zram devices)."""
    out = []
    try:
        for dev in sorted(sys_block.iterdir()):
            if dev.name.startswith(("loop", "ram", "zram")):
                continue
            with_dev = dev / "dev"
            if with_dev.exists():
                out.append(with_dev.read_text().strip())
    except OSError:
        return []
    return out


def _blkio_accounting(group: Path, sys_block: Path) -> bool:
    """Set a never-limiting throttle rule per device so the kernel counts the group's I/O."""
    ok = False
    for dev in _block_devices(sys_block):
        for f in ("blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"):
            try:
                (group / f).write_text(f"{dev} {ACCOUNTING_BPS}")
                ok = True
            except OSError:
                continue
    return ok


def _root_of(layout: CgroupLayout, sysfs: Path, root: str | None) -> str:
    """The job cgroups' root as a name relative to each hierarchy: `root` when given, else read
    from where the layout put job cgroups (a v1 `cpu/<root>`), so that the node's blkio and
    unified groups sit beside its cpu and memory ones."""
    if root:
        return root
    for p in (layout.cpu_parent, layout.memory_parent):
        if p is not None and sysfs in p.parents:
            parts = p.relative_to(sysfs).parts[1:]
            if parts:
                return "/".join(parts)
    return "sluice"


def _hold_cores(group: Path, cpus: Sequence[int], missing: list[str]) -> None:
    """A v2 virtual node's group holds its cores (`cpuset.cpus`): its jobs and faults below
    inherit them, and no job can widen its affinity past them (affinity alone, what v2 hosts
    had, a job may reset). Where it cannot be written, affinity stays all there is."""
    try:
        (group / "cpuset.cpus").write_text(",".join(map(str, cpus)))
    except OSError as err:
        missing.append(f"node cpuset: cannot write {group / 'cpuset.cpus'} ({err.strerror}); jobs kept by affinity")


def node_groups(
    layout: CgroupLayout,
    node: str,
    sysfs: Path = SYSFS_CGROUP,
    root: str | None = None,
    sys_block: Path = Path("/sys/block"),
    cpus: Sequence[int] | None = None,
) -> NodeGroups:
    """Make (or find) the node's groups under `layout`'s parents and return where they are,
    with the job layout scoped to the node. Never raises: what cannot be made is listed in
    `missing`, and jobs then use `layout` as it was for that hierarchy. (`sysfs`, `sys_block`:
    where cgroups and block devices are listed; tests pass fake trees. `root`: the job
    cgroups' root, default: where `layout` put them. `cpus`: a virtual node's cores, which on
    v2 its group holds as a cpuset; v1 has its own cpuset hierarchy, cgroup.node_cpuset.)"""
    root = _root_of(layout, sysfs, root)
    missing: list[str] = []
    scoped = layout
    usage: Path | None = None
    usage_kind: CgroupKind | None = None
    unified: Path | None = None
    fault_leaf: Path | None = None
    if layout.kind is CgroupKind.V2 and layout.cpu_parent is not None:
        d = layout.cpu_parent / node
        mount = _v2_mount_of(d, sysfs)
        if mount is not None and _ensure_dir(d) and _enable_v2(mount, d, "cpu"):
            scoped = replace(scoped, cpu_parent=d)
            usage, usage_kind, unified = d, CgroupKind.V2, d
            if cpus is not None and layout.cpuset_v2:
                _hold_cores(d, cpus, missing)
            leaf = d / FAULT_LEAF
            fault_leaf = leaf if _ensure_dir(leaf) else None
        else:
            missing.append(f"node CPU usage: cannot make {d} with the cpu controller")
    elif layout.kind is CgroupKind.V1 and layout.cpu_parent is not None:
        d = layout.cpu_parent / node
        if _ensure_dir(d):
            scoped = replace(scoped, cpu_parent=d)
            if layout.cpuacct_parent is not None:
                acct = layout.cpuacct_parent / node
                if _ensure_dir(acct):
                    scoped = replace(scoped, cpuacct_parent=acct)
                    usage = acct
            elif (d / "cpuacct.usage").exists():
                usage = d
            usage_kind = CgroupKind.V1 if usage is not None else None
        if usage is None:
            missing.append(f"node CPU usage: no writable cpuacct group for {node}")
    else:
        missing.append(f"node CPU usage: no cgroup cpu controller ({layout.reason or 'affinity mode'})")

    memory: Path | None = None
    if layout.memory_parent is not None and layout.memory_kind is not None:
        m = layout.memory_parent / node
        if layout.memory_kind is CgroupKind.V2:
            mount = _v2_mount_of(m, sysfs)
            if mount is not None and _ensure_dir(m) and _enable_v2(mount, m, "memory"):
                memory = m
                if fault_leaf is None:
                    leaf = m / FAULT_LEAF
                    fault_leaf = leaf if _ensure_dir(leaf) else None
        elif _ensure_dir(m):
            memory = m
        if memory is not None:
            scoped = replace(scoped, memory_parent=memory)
        else:
            missing.append(f"node memory: cannot make {m}")
    else:
        missing.append(f"node memory: {layout.memory_reason or 'no cgroup memory controller'}")

    blkio: Path | None = None
    if usage_kind is CgroupKind.V2 and usage is not None:
        mount = _v2_mount_of(usage, sysfs)
        if mount is None or not _enable_v2(mount, usage, "io"):
            missing.append("node block I/O: the v2 io controller cannot be delegated")
    elif (sysfs / "blkio" / "blkio.throttle.io_service_bytes").exists():
        b = _parent_under(sysfs / "blkio", root) / node
        if _ensure_dir(b) and _blkio_accounting(b, sys_block):
            blkio = b
        else:
            missing.append(f"node block I/O: cannot make {b} or set its accounting rule")
    else:
        missing.append("node block I/O: no blkio (v1) or io (v2) controller")

    if unified is None:
        hybrid = sysfs / "unified"
        if (hybrid / "cgroup.controllers").exists() and (hybrid / "cpu.pressure").exists():
            u = _parent_under(hybrid, root) / node
            unified = u if _ensure_dir(u) else None
    if unified is None or not (unified / "cpu.pressure").exists():
        missing.append("node pressure (PSI): no cgroup v2 group with *.pressure files (kernel PSI off?)")
    net: NodeNet | NodeNetV2 | None = None
    if sysfs == SYSFS_CGROUP:  # a fake tree (tests) never touches the real net_cls or nft
        net = _node_net(node, root, sysfs, usage, usage_kind, unified)
        if not isinstance(net, NodeNetV2) or net.missing:
            what = "node network ingress" if not net.missing else "node network egress and ingress"
            missing.append(f"{what}: {net.missing or 'counted on cgroup v2 only, and the node has no v2 group'}")
    return NodeGroups(
        node,
        scoped,
        usage,
        usage_kind,
        memory,
        layout.memory_kind if memory else None,
        blkio,
        unified,
        fault_leaf,
        tuple(missing),
        net if net is not None and net.group is not None else None,
    )


def _node_net(
    node: str, root: str, sysfs: Path, usage: Path | None, usage_kind: CgroupKind | None, unified: Path | None
) -> NodeNet | NodeNetV2:
    """The node's network counters: its v2 group where it has one (v2-only host: the usage
    group, whose job children the CPU controller makes; hybrid host: the `unified` group, whose
    job children are made by the counters), which counts egress and ingress; else v1 net_cls,
    egress only."""
    if usage_kind is CgroupKind.V2 and usage is not None and (mount := _v2_mount_of(usage, sysfs)) is not None:
        return node_net_v2(node, usage, mount)
    if unified is not None and (mount := _v2_mount_of(unified, sysfs)) is not None:
        net = node_net_v2(node, unified, mount, owns_jobs=True)
        if not net.missing:
            return net
        log.info("node %s: v2 network accounting unavailable (%s); trying net_cls", node, net.missing)
    return node_net(node, root, sysfs)


# ---------------------------------------------------------------------------------- reading
def _flat(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file (`key value` per line); {} when unreadable."""
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().lstrip("-").isdigit():
                out[k] = int(v)
    except OSError:
        return {}
    return out


def _int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _psi_total(path: Path, line: str) -> float | None:
    """Cumulative stall time (seconds) of the `some` or `full` line of a *.pressure file."""
    try:
        for row in path.read_text().splitlines():
            if row.startswith(line + " "):
                for field in row.split():
                    if field.startswith("total="):
                        return int(field[6:]) / 1e6
    except (OSError, ValueError):
        return None
    return None


def _cpu_s(d: Path, kind: CgroupKind) -> tuple[float, float] | None:
    """(total, system) CPU seconds used by the group's processes, descendants included."""
    if kind is CgroupKind.V2:
        st = _flat(d / "cpu.stat")
        if "usage_usec" not in st:
            return None
        return st["usage_usec"] / 1e6, st.get("system_usec", 0) / 1e6
    total = _int(d / "cpuacct.usage")
    if total is None:
        return None
    sys_ns = _int(d / "cpuacct.usage_sys")
    if sys_ns is not None:
        return total / 1e9, sys_ns / 1e9
    ticks = _flat(d / "cpuacct.stat").get("system", 0)
    return total / 1e9, ticks / (os.sysconf("SC_CLK_TCK") or 100)


def _throttled_s(d: Path, kind: CgroupKind) -> float:
    st = _flat(d / "cpu.stat")
    return st.get("throttled_usec", 0) / 1e6 if kind is CgroupKind.V2 else st.get("throttled_time", 0) / 1e9


def _blkio(d: Path) -> dict[str, float]:
    """v1 recursive bytes and operations, summed over devices."""
    out = {"io_read_bytes": 0.0, "io_write_bytes": 0.0, "io_ops": 0.0}
    for fname, keys in (
        ("blkio.throttle.io_service_bytes_recursive", {"Read": "io_read_bytes", "Write": "io_write_bytes"}),
        ("blkio.throttle.io_serviced_recursive", {"Total": "io_ops"}),
    ):
        try:
            rows = (d / fname).read_text().splitlines()
        except OSError:
            continue
        for row in rows:
            parts = row.split()
            if len(parts) == 3 and parts[1] in keys:
                out[keys[parts[1]]] += float(parts[2])
    return out


def _io_stat(d: Path) -> dict[str, float]:
    """v2 io.stat, summed over devices."""
    out = {"io_read_bytes": 0.0, "io_write_bytes": 0.0, "io_ops": 0.0}
    try:
        rows = (d / "io.stat").read_text().splitlines()
    except OSError:
        return out
    for row in rows:
        for field in row.split()[1:]:
            k, _, v = field.partition("=")
            if not v.isdigit():
                continue
            if k == "rbytes":
                out["io_read_bytes"] += float(v)
            elif k == "wbytes":
                out["io_write_bytes"] += float(v)
            elif k in ("rios", "wios"):
                out["io_ops"] += float(v)
    return out


def _children(d: Path) -> Iterable[Path]:
    try:
        return [c for c in d.iterdir() if c.is_dir() and c.name != FAULT_LEAF]
    except OSError:
        return []


def read_counters(groups: NodeGroups) -> dict[str, float]:
    """The node's cumulative counters (seconds, bytes, counts) and levels (memory bytes), and
    per job (`job:<cgroup name>:cpu_s`), for `KpiSampler` to turn into rates."""
    out: dict[str, float] = {}
    if groups.usage is not None and groups.usage_kind is not None:
        cpu = _cpu_s(groups.usage, groups.usage_kind)
        if cpu is not None:
            out["cpu_s"], out["cpu_system_s"] = cpu
        throttled = 0.0
        cpu_dir = groups.layout.cpu_parent
        for child in _children(groups.usage):
            job = _cpu_s(child, groups.usage_kind)
            if job is not None:
                out[f"job:{child.name}:cpu_s"] = job[0]
            if cpu_dir is not None:
                throttled += _throttled_s(cpu_dir / child.name, groups.usage_kind)
        out["cpu_throttled_s"] = throttled
    if groups.memory is not None:
        if groups.memory_kind is CgroupKind.V2:
            used = _int(groups.memory / "memory.current")
            stat = _flat(groups.memory / "memory.stat")
            events = _flat(groups.memory / "memory.events")
            out["mem_limit_hits"] = float(events.get("max", 0) + events.get("oom", 0))
            out["mem_majfaults"] = float(stat.get("pgmajfault", 0))
        else:
            used = _int(groups.memory / "memory.usage_in_bytes")
            stat = _flat(groups.memory / "memory.stat")
            hits = sum(_int(c / "memory.failcnt") or 0 for c in _children(groups.memory))
            out["mem_limit_hits"] = float(hits + (_int(groups.memory / "memory.failcnt") or 0))
            out["mem_majfaults"] = float(stat.get("total_pgmajfault", stat.get("pgmajfault", 0)))
        if used is not None:
            out["mem_bytes"] = float(used)
    if groups.blkio is not None:
        out.update(_blkio(groups.blkio))
    elif groups.usage_kind is CgroupKind.V2 and groups.usage is not None and (groups.usage / "io.stat").exists():
        out.update(_io_stat(groups.usage))
    if groups.unified is not None:
        for res in ("cpu", "memory", "io"):
            some = _psi_total(groups.unified / f"{res}.pressure", "some")
            if some is not None:
                out[f"psi_{res}_some_s"] = some
            full = _psi_total(groups.unified / f"{res}.pressure", "full") if res != "cpu" else None
            if full is not None:
                out[f"psi_{res}_full_s"] = full
    if groups.net is not None:
        out.update(groups.net.counters())
    return out


def warn_missing(groups: NodeGroups) -> None:
    """Say once per node which per-node KPI families are missing here, and why."""
    for line in groups.missing:
        log.warning("node %s: %s; those per-node KPIs are not reported", groups.node, line)


def group_dirs(groups: NodeGroups, unscoped: CgroupLayout, cpuset: Path | None = None) -> list[Path]:
    """Every directory made for the node: its group in each hierarchy, the faults leaf, its
    cpuset and its net_cls group (what `node_owners` records, to sweep after a killed agent).
    Never one of `unscoped`'s parents (the layout before `node_groups`): where a node group
    could not be made, the node's jobs use that shared root, which is not the node's."""
    net = groups.net.group if groups.net is not None else None
    dirs = [groups.fault_leaf, groups.layout.cpu_parent, groups.layout.cpuacct_parent, groups.usage]
    dirs += [groups.memory, groups.blkio, groups.unified, cpuset, net]
    shared = {unscoped.cpu_parent, unscoped.cpuacct_parent, unscoped.memory_parent, unscoped.cpuset_parent}
    return list(dict.fromkeys(d for d in dirs if d is not None and d not in shared))


def remove_groups(groups: NodeGroups, cpuset: Path | None = None, keep: Collection[str] = ()) -> None:
    """Remove the node's groups that are empty (best effort, when its agent closes), and its
    cpuset (`cgroup.node_cpuset`) when given: a group that still holds a job (left running
    for the next agent to adopt) stays, and so do the job groups named in `keep`."""
    if groups.net is not None:
        groups.net.close(keep)
    dirs = [groups.fault_leaf, groups.layout.cpu_parent, groups.usage, groups.memory, groups.blkio, groups.unified]
    dirs.append(cpuset)
    for d in dict.fromkeys(x for x in dirs if x is not None):
        try:
            d.rmdir()
        except OSError:
            continue
