"""One node's network egress, counted by the kernel per node and per job (cgroup v1 net_cls +
nftables).

Why: virtual nodes share the machine's network interfaces, so machine-wide byte counters
cannot say which node is flooding the network. The kernel can: every socket of a process in a
`net_cls` cgroup tags its packets with that group's class id, and an nftables rule on the
output hook (`meta cgroup <classid> counter`) counts the packets and bytes sent with it.

Layout: `net_cls/<root>/<node>` (class id MAJOR:1) holds what the node runs that is not a job
(injected faults); each job attempt gets `net_cls/<root>/<node>/<job cgroup>` with its own
class id (MAJOR:2, 3, ...). A packet carries one class id — its group's, not its ancestors'
— so the node's total is the node rule plus every job rule, and the node rule alone is the
"other" traffic (`node_net_other_tx_mbps`).

One nft table per agent (`inet sluice_net_<pid>_<n>`, unique per agent process and node) holds
the rules; it is deleted when the agent closes, and a table left by a killed agent (its pid
gone) is deleted by the next agent that starts. v1 counts egress only (below). nft is always
run with an argument list, never through a shell.

Where net_cls is not in the kernel, cannot be mounted, or nft is missing, `missing` says why
and the network KPIs are absent.

On cgroup v2 (`NodeNetV2`) there is no class id: nft's `socket cgroupv2 level N "<path>"`
matches a packet whose socket belongs to a process anywhere under the v2 group at that
depth. The node's rule matches all its traffic (its total); each job's rule, one level
deeper, its job group's; "other" is the total less every job's (live or retired). On a
v2-only host the groups are the node's own v2 groups (`node_cgroup`), so nothing is made
here but the table. On a hybrid host (v1 controllers, plus the v2 tree at
`/sys/fs/cgroup/unified` with no controllers) the node's group is its `unified` group and
each job gets a child of it here (`owns_jobs`), which the job joins like any other group.

Ingress, v2 only: the same `socket cgroupv2` match on the input hook looks up the socket a
packet is delivered to, so it counts what the node's (and each job's) processes *receive* —
on loopback too, where the sender and the receiver are two nodes of one machine (v1's `meta
cgroup` sees no socket on the input hook: measured, it counts nothing there).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.agent.cgroup import SYSFS_CGROUP, _ensure_dir, _parent_under

log = logging.getLogger(__name__)

TABLE_PREFIX = "sluice_net_"
NODE_COMMENT = "node"
_SEQ = itertools.count()
_NFT_TIMEOUT_S = 5.0


def _mountinfo_net_cls(mountinfo: Path = Path("/proc/self/mountinfo")) -> Path | None:
    """Where a v1 hierarchy with the net_cls controller is mounted (None: nowhere)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(rfields) >= 3 and rfields[0] == "cgroup" and "net_cls" in rfields[2].split(","):
            return Path(fields[4])
    return None


def _kernel_has_net_cls(proc_cgroups: Path = Path("/proc/cgroups")) -> bool:
    try:
        for row in proc_cgroups.read_text().splitlines():
            parts = row.split()
            if len(parts) == 4 and parts[0] == "net_cls" and parts[3] == "1":
                return True
    except OSError:
        return False
    return False


def find_net_cls(sysfs: Path = SYSFS_CGROUP, mount: bool = True) -> tuple[Path | None, str]:
    """(mount point of net_cls, why not). Mounts it at `sysfs/net_cls` where the kernel has it
    but no hierarchy is mounted (as distributions do on a v1 host), when `mount` is set."""
    found = _mountinfo_net_cls()
    if found is not None and (found / "net_cls.classid").exists():
        return found, ""
    if (sysfs / "net_cls" / "net_cls.classid").exists():
        return sysfs / "net_cls", ""
    if not _kernel_has_net_cls():
        return None, "the kernel has no net_cls cgroup controller"
    if (sysfs / "cgroup.controllers").exists():
        return None, "cgroup v2 only (net_cls is v1), and the node has no v2 group of its own to count by"
    target = sysfs / "net_cls"
    mnt = shutil.which("mount")
    if not mount or mnt is None or not _ensure_dir(target):
        return None, f"net_cls is not mounted and {target} cannot be made"
    try:
        subprocess.run(
            [mnt, "-t", "cgroup", "-o", "net_cls", "net_cls", str(target)],
            check=True,
            capture_output=True,
            timeout=_NFT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"net_cls is not mounted and mounting it at {target} failed ({err})"
    return (target, "") if (target / "net_cls.classid").exists() else (None, f"{target}: no net_cls.classid")


def _nft(nft: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([nft, *args], input=stdin, capture_output=True, text=True, timeout=_NFT_TIMEOUT_S, check=True)


def _read_rules(nft: str, table: str) -> list[tuple[str, float, float, int | None]] | None:
    """(comment, bytes, packets, handle) of every counting rule in the table; None when nft
    cannot list it."""
    try:
        data = json.loads(_nft(nft, "-j", "list", "table", "inet", table).stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    out: list[tuple[str, float, float, int | None]] = []
    for item in data.get("nftables", []):
        rule = item.get("rule")
        if not rule:
            continue
        for expr in rule.get("expr", []):
            c = expr.get("counter") if isinstance(expr, dict) else None
            if c is not None:
                handle = int(rule["handle"]) if "handle" in rule else None
                out.append((rule.get("comment", ""), float(c.get("bytes", 0)), float(c.get("packets", 0)), handle))
    return out


RX = "rx:"
"""Prefix of the comments of ingress rules (chain `in`); egress rules (chain `out`) have none."""


def _chain_of(comment: str) -> str:
    return "in" if comment.startswith(RX) else "out"


def _delete_rule(nft: str, table: str, handle: int, chain: str = "out") -> bool:
    try:
        _nft(nft, "delete", "rule", "inet", table, chain, "handle", str(handle))
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def delete_tables(nft: str, doomed: Callable[[str], bool]) -> list[str]:
    """Delete the host's `inet` tables whose names `doomed` picks; the names deleted (a table
    nft will not list or delete is skipped)."""
    try:
        listed = json.loads(_nft(nft, "-j", "list", "tables", "inet").stdout or "{}")
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    removed = []
    for item in listed.get("nftables", []):
        name = str(item.get("table", {}).get("name", ""))
        if not doomed(name):
            continue
        try:
            _nft(nft, "delete", "table", "inet", name)
            removed.append(name)
        except (OSError, subprocess.SubprocessError):
            continue
    return removed


def clean_stale_tables(nft: str) -> list[str]:
    """Delete `sluice_net_<pid>_*` tables whose agent process is gone (a killed run's)."""

    def stale(name: str) -> bool:
        m = re.fullmatch(rf"{TABLE_PREFIX}(\d+)_\d+", name)
        return m is not None and not Path(f"/proc/{m.group(1)}").exists()

    return delete_tables(nft, stale)


def classid_major(node_dir: Path) -> int:
    """A 16-bit major for the node's class ids, from its group's path: two nodes (or two
    planes with their own roots) get different majors unless their paths' hashes collide."""
    return (zlib.crc32(str(node_dir).encode()) & 0x7FFF) | 0x10


class _RuleBook:
    """What both kinds of node counters do with their nft table: retire a job's rule (its
    bytes kept in `_retired`) and delete the table. Expects the attributes both dataclasses
    declare: nft, table, _rules, _retiring, _retired."""

    nft: str
    table: str
    _rules: dict[str, Any]
    _retiring: set[str]
    _retired: list[float]

    def _retire(self, comment: str, handle: int, nbytes: float, packets: float) -> None:
        """Delete a retiring rule, keeping its bytes and packets (sent: `_retired[0:2]`,
        received: `[2:4]`)."""
        if not _delete_rule(self.nft, self.table, handle, _chain_of(comment)):
            return  # kept, and tried again at the next reading
        at = 2 if comment.startswith(RX) else 0
        self._retired[at] += nbytes
        self._retired[at + 1] += packets
        self._retiring.discard(comment)
        self._rules.pop(comment, None)

    def _drop_table(self) -> None:
        if self.table and self.nft:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _nft(self.nft, "delete", "table", "inet", self.table)
        self._rules.clear()
        self._retiring.clear()


@dataclass
class NodeNet(_RuleBook):
    """A node's net_cls group and its nft table. `group` None: not available (see `missing`)."""

    node: str
    group: Path | None = None
    table: str = ""
    nft: str = ""
    major: int = 0
    missing: str = ""
    _rules: dict[str, int] = field(default_factory=dict)
    """Comment (`node` or `job:<group>`) → class id of the rules in the table."""
    _retiring: set[str] = field(default_factory=set)
    """Comments of rules whose job group is gone: counted once more, then deleted."""
    _retired: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    """Bytes and packets of deleted job rules, kept in the node's total (which only grows)."""

    @property
    def procs(self) -> str | None:
        return None if self.group is None else str(self.group / "cgroup.procs")

    def job_group(self, name: str) -> str | None:
        """Make the job attempt's own group (own class id, own counter rule); its cgroup.procs
        file for the job to join, None where there is no net accounting."""
        if self.group is None:
            return None
        d = self.group / name
        if not _ensure_dir(d):
            return None
        used = set(self._rules.values())
        minor = next(m for m in itertools.count(2) if (self.major << 16 | m) not in used)
        classid = self.major << 16 | minor
        try:
            # A new group inherits its parent's (the node's) class id; a job group an earlier
            # agent made (adopted job) already has its own.
            existing = int((d / "net_cls.classid").read_text().strip() or "0")
            if (existing >> 16) == self.major and existing & 0xFFFF >= 2 and existing not in used:
                classid = existing
            else:
                (d / "net_cls.classid").write_text(str(classid))
        except (OSError, ValueError):
            return None
        self._add_rule(f"job:{name}", classid)
        return str(d / "cgroup.procs")

    def _add_rule(self, comment: str, classid: int) -> None:
        if comment in self._rules:
            return
        try:
            _nft(
                self.nft,
                "add", "rule", "inet", self.table, "out",
                "meta", "cgroup", hex(classid), "counter", "comment", f'"{comment}"',
            )  # fmt: skip
            self._rules[comment] = classid
        except (OSError, subprocess.SubprocessError) as err:
            log.debug("node %s: nft rule for %s not added: %s", self.node, comment, err)

    def drop_job(self, name: str) -> None:
        """Remove the job attempt's group (once its processes are gone); its rule is deleted
        at the next reading, its bytes kept in the node's total (so the table does not grow
        with every attempt an agent ever ran)."""
        if self.group is not None:
            with contextlib.suppress(OSError):
                (self.group / name).rmdir()
        if f"job:{name}" in self._rules:
            self._retiring.add(f"job:{name}")

    def counters(self) -> dict[str, float]:
        """Cumulative bytes and packets sent: `net_tx_bytes`/`net_tx_packets` (node total),
        `net_other_tx_bytes`/`..._packets` (the node group itself: not its jobs), and per job
        `job:<group>:net_tx_bytes`. {} where unavailable or nft cannot be read."""
        if self.group is None:
            return {}
        for child in _children(self.group):
            if f"job:{child.name}" not in self._rules:
                self.job_group(child.name)  # adopted jobs (started by an earlier agent)
        rules = _read_rules(self.nft, self.table)
        if rules is None:
            return {}
        out = {"net_tx_bytes": self._retired[0], "net_tx_packets": self._retired[1]}
        out.update(net_other_tx_bytes=0.0, net_other_tx_packets=0.0)
        for comment, b, p, handle in rules:
            out["net_tx_bytes"] += b
            out["net_tx_packets"] += p
            if comment == NODE_COMMENT:
                out["net_other_tx_bytes"] += b
                out["net_other_tx_packets"] += p
            elif comment.startswith("job:"):
                out[f"{comment}:net_tx_bytes"] = b
            if comment in self._retiring and handle is not None:
                self._retire(comment, handle, b, p)
        return out

    def close(self, keep: Collection[str] = ()) -> None:
        """Delete the table and the empty groups (a group still holding a job stays, and so do
        the groups named in `keep`: attempts that run on, whose shim may not have joined yet)."""
        self._drop_table()
        if self.group is not None:
            for d in [*(c for c in _children(self.group) if c.name not in keep), self.group]:
                try:
                    d.rmdir()
                except OSError:
                    continue


def _children(d: Path) -> list[Path]:
    try:
        return sorted(c for c in d.iterdir() if c.is_dir())
    except OSError:
        return []


def _make_table(nft: str, ingress: bool = False) -> tuple[str, str]:
    """A new table with an output chain (and an input chain for `ingress`), named for this
    agent process: (name, why not)."""
    table = f"{TABLE_PREFIX}{os.getpid()}_{next(_SEQ)}"
    script = f"add table inet {table}\nadd chain inet {table} out {{ type filter hook output priority 0; }}\n"
    if ingress:
        script += f"add chain inet {table} in {{ type filter hook input priority 0; }}\n"
    try:
        _nft(nft, "-f", "-", stdin=script)
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        return table, f"nft cannot make table {table}: {str(detail).strip()}"
    return table, ""


def node_net(node: str, root: str, sysfs: Path = SYSFS_CGROUP, mount: bool = True) -> NodeNet:
    """Make the node's net_cls group and its agent's nft table (never raises: what cannot be
    made is said in `missing`, and the network KPIs are then absent)."""
    nft = shutil.which("nft")
    if nft is None:
        return NodeNet(node, missing="no nft command (apt-get install nftables)")
    where, why = find_net_cls(sysfs, mount)
    if where is None:
        return NodeNet(node, missing=why)
    group = _parent_under(where, root) / node
    if not _ensure_dir(group):
        return NodeNet(node, missing=f"cannot make {group}")
    major = classid_major(group)
    try:
        (group / "net_cls.classid").write_text(str(major << 16 | 1))
    except OSError as err:
        return NodeNet(node, missing=f"cannot set {group}/net_cls.classid ({err.strerror})")
    clean_stale_tables(nft)
    table, why = _make_table(nft)
    if why:
        return NodeNet(node, missing=why)
    net = NodeNet(node, group, table, nft, major)
    net._add_rule(NODE_COMMENT, major << 16 | 1)
    if NODE_COMMENT not in net._rules:
        net.close()
        return NodeNet(node, missing=f"nft cannot add a `meta cgroup` rule to {table}")
    return net


@dataclass
class NodeNetV2(_RuleBook):
    """A node's egress and ingress counted by its cgroup v2 groups (see the module's docstring).

    `group`: the node's v2 group (jobs are its children); `mount`: the v2 hierarchy's mount;
    `owns_jobs`: the job groups are made (and removed) here, for jobs to join (hybrid host).
    `missing` says why nothing is counted; `group` is then None."""

    node: str
    group: Path | None = None
    mount: Path | None = None
    table: str = ""
    nft: str = ""
    missing: str = ""
    owns_jobs: bool = False
    _rules: dict[str, str] = field(default_factory=dict)
    """Comment (`node`, `job:<group>`, and the same behind RX for ingress) → the group path."""
    _retiring: set[str] = field(default_factory=set)
    _retired: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    """Bytes and packets sent, then received, of deleted job rules: still in the node's total,
    not "other"."""

    @property
    def procs(self) -> str | None:
        """The node group's cgroup.procs where this owns the job groups (what is not a job
        sits in the node's group itself); on a v2-only host nothing: a process is counted by
        the group it already sits in."""
        return str(self.group / "cgroup.procs") if self.owns_jobs and self.group is not None else None

    def _add_rule(self, comment: str, group: Path) -> bool:
        """The egress rule and the ingress rule for one group; True when both are in."""
        if comment in self._rules:
            return True
        assert self.mount is not None
        try:
            level = len(group.relative_to(self.mount).parts)
            # nft resolves the path under /sys/fs/cgroup (where a v2-only host mounts it; on
            # a hybrid host the v2 tree is at /sys/fs/cgroup/unified).
            path = str(group.relative_to(SYSFS_CGROUP))
        except ValueError:
            log.debug("node %s: %s is not under %s", self.node, group, SYSFS_CGROUP)
            return False
        if not re.fullmatch(r"[A-Za-z0-9_.\-/]+", path):
            return False  # a name nft would not parse as one string
        match = ("socket", "cgroupv2", "level", str(level), f'"{path}"', "counter")
        try:
            _nft(self.nft, "add", "rule", "inet", self.table, "out", *match, "comment", f'"{comment}"')
            self._rules[comment] = path
            _nft(self.nft, "add", "rule", "inet", self.table, "in", *match, "comment", f'"{RX}{comment}"')
            self._rules[RX + comment] = path
        except (OSError, subprocess.SubprocessError) as err:
            log.debug("node %s: nft rule for %s not added: %s", self.node, comment, err)
            return False
        return True

    def job_group(self, name: str) -> str | None:
        """Count the job attempt's own v2 group (`<node group>/<name>`). On a v2-only host the
        job's CPU controller made it, and there is nothing to join (None); on a hybrid host it
        is made here and its cgroup.procs returned for the job to join."""
        if self.group is None:
            return None
        d = self.group / name
        if self.owns_jobs and not _ensure_dir(d):
            return None
        if d.is_dir() and self._add_rule(f"job:{name}", d) and self.owns_jobs:
            return str(d / "cgroup.procs")
        return None

    def drop_job(self, name: str) -> None:
        """The job attempt ended: its rules are deleted at the next reading, its bytes kept
        out of the node's "other" traffic (and the group it joined removed, where this made
        it)."""
        if self.owns_jobs and self.group is not None:
            with contextlib.suppress(OSError):
                (self.group / name).rmdir()
        for comment in (f"job:{name}", f"{RX}job:{name}"):
            if comment in self._rules:
                self._retiring.add(comment)

    def counters(self) -> dict[str, float]:
        """`NodeNet.counters`' keys, and the same for what was received: `net_rx_bytes`,
        `net_rx_packets`, `net_other_rx_bytes`/`..._packets`, `job:<group>:net_rx_bytes`.
        {} where unavailable or nft cannot be read."""
        if self.group is None:
            return {}
        for child in _children(self.group):
            if child.name != "faults" and f"job:{child.name}" not in self._rules:
                self.job_group(child.name)  # adopted jobs (started by an earlier agent)
        rules = _read_rules(self.nft, self.table)
        if rules is None:
            return {}
        total = [0.0, 0.0, 0.0, 0.0]
        jobs = list(self._retired)
        out: dict[str, float] = {}
        for comment, b, pk, handle in rules:
            rx = comment.startswith(RX)
            name, at, key = (comment[len(RX) :], 2, "net_rx_bytes") if rx else (comment, 0, "net_tx_bytes")
            if name == NODE_COMMENT:
                total[at], total[at + 1] = b, pk
            elif name.startswith("job:"):
                out[f"{name}:{key}"] = b
                jobs[at] += b
                jobs[at + 1] += pk
                if comment in self._retiring and handle is not None:
                    self._retire(comment, handle, b, pk)
        for at, way in ((0, "tx"), (2, "rx")):
            out[f"net_{way}_bytes"] = total[at]
            out[f"net_{way}_packets"] = total[at + 1]
            out[f"net_other_{way}_bytes"] = max(0.0, total[at] - jobs[at])
            out[f"net_other_{way}_packets"] = max(0.0, total[at + 1] - jobs[at + 1])
        return out

    def close(self, keep: Collection[str] = ()) -> None:
        """Delete the table (and the empty job groups this made, but those named in `keep`:
        attempts that run on, whose shim may not have entered its group yet — without it the
        job would run outside the group its network fence matches; the node's group is
        node_cgroup's)."""
        self._drop_table()
        if self.owns_jobs and self.group is not None:
            for d in (c for c in _children(self.group) if c.name not in keep):
                with contextlib.suppress(OSError):
                    d.rmdir()


def node_net_v2(node: str, group: Path, mount: Path, owns_jobs: bool = False) -> NodeNetV2:
    """Count the egress and ingress of the node's v2 group `group` (on the v2 hierarchy at
    `mount`) and of its job groups, made here when `owns_jobs` (never raises: what cannot be
    done is said in `missing`)."""
    nft = shutil.which("nft")
    if nft is None:
        return NodeNetV2(node, missing="no nft command (apt-get install nftables)")
    clean_stale_tables(nft)
    table, why = _make_table(nft, ingress=True)
    if why:
        return NodeNetV2(node, missing=why)
    net = NodeNetV2(node, group, mount, table, nft, owns_jobs=owns_jobs)
    if not net._add_rule(NODE_COMMENT, group):
        net.close()
        return NodeNetV2(node, missing=f"nft cannot add a `socket cgroupv2` rule for {group} to {table}")
    return net
