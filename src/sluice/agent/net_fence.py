"""Keep one tenant's jobs from connecting to another tenant's jobs on the same machine.

Jobs share the host's network namespace, so a job could open a TCP connection (or send a
datagram) to any socket another job listens on — another tenant's DDP rendezvous store
(`MASTER_PORT`, no authentication), its gloo or NCCL sockets, a notebook or TensorBoard it
started — over loopback or the machine's own addresses. The kernel can tell which job a
packet belongs to at both ends: nftables' `socket cgroupv2` matches, on the output hook, the
socket that sends a packet and, on the input hook, the socket it is delivered to, by the job's
cgroup v2 group (agent/node_net.py counts traffic the same way). So:

- output: a packet sent by a socket of job J marks its connection (`ct mark`) with J's
  tenant: MARK_BIT | uid;
- output, too: a packet sent by *any* socket of a tenant's uid whose tenant the node has seen
  (a job launched, a dataset warmed for it: the `tenants` map) marks its connection the same
  way. The tenant's processes that are not in a job group — the dataset cache helper
  (`sluice.data.cache_ops`, started as the tenant's uid in the plane's own group), which the
  tenant's jobs may ptrace, and whose warm fetches a URL the tenant chose — would otherwise
  connect unmarked, and pass;
- input: a packet delivered to a socket of job J whose connection carries another tenant's
  mark is dropped.

A connection between two jobs of one tenant (a gang's replicas, on one virtual node or two),
from a job to a process that is not a job (the API, a dataset server) and back, and from
another machine pass: their marks agree, or there is none. The rules live in a table of the
node's own (`sluice_fence_<hash of its group>`), kept across an agent restart (running jobs
stay fenced while the plane is down) and reconciled with the adopted attempts by the next
agent; removed when an agent closes with no job running. nft is always run with an argument
list, never through a shell.

Limits (docs/security.md): only where jobs have cgroup v2 groups (a v2 host, or a hybrid one
with the `unified` tree) and nft is installed; a job's connections to another machine are not
judged (the mark does not leave the host); Unix sockets (abstract ones included) are not
covered; without isolation every job is one uid and nothing is fenced.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import subprocess
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from sluice.agent.cgroup import SYSFS_CGROUP
from sluice.agent.node_net import _nft, delete_tables

log = logging.getLogger(__name__)

MARK_BIT = 0x80000000
"""The connection-mark bit that says "a sluice job's tenant is in the low bits"."""
TABLE_PREFIX = "sluice_fence_"
_COMMENT = "fence:"
TENANTS_MAP = "tenants"
"""uid → its tenant's mark, of every tenant the node has run a job or a cache helper for."""
UIDS_CHAIN = "uids"
PROTOS_CHAIN = "protos"


def _root_prefix(root_dir: Path) -> str:
    return f"{TABLE_PREFIX}{zlib.crc32(str(root_dir).encode()):08x}_"


def table_name(node_group: Path) -> str:
    """The node's table: one per node group, the same for every agent of that node; named
    after its cgroup root too, so that a run with a root of its own can find its tables when
    the node groups are gone (drop_tables_under)."""
    return f"{_root_prefix(node_group.parent)}{zlib.crc32(str(node_group).encode()):08x}"


def tenant_mark(uid: int) -> int:
    if not 0 < uid < MARK_BIT:
        raise ValueError(f"uid {uid}: out of the range a connection mark can carry")
    return MARK_BIT | uid


@dataclass
class NetFence:
    """The node's fence table. `missing` says why there is none (then nothing is fenced)."""

    table: str = ""
    nft: str = ""
    mount: Path | None = None
    missing: str = ""
    _rules: set[str] = field(default_factory=set)
    """Job groups whose rules this agent made or adopted."""

    @property
    def available(self) -> bool:
        return not self.missing

    def mark_tenant(self, uid: int) -> None:
        """Mark every connection a socket of uid `uid` opens (the `tenants` map), in a job group
        or not; kept while the table lives (a tenant's uid is never another's). Raises OSError
        when nft refuses."""
        if self.missing:
            return
        element = f"{{ {uid} : {tenant_mark(uid):#x} }}"
        try:
            _nft(self.nft, "add", "element", "inet", self.table, TENANTS_MAP, element)
        except (OSError, subprocess.SubprocessError) as err:
            detail = str(getattr(err, "stderr", "") or err).strip()
            raise OSError(f"network fence: nft refused to mark uid {uid}'s connections: {detail}") from None

    def add(self, name: str, group: Path, uid: int) -> None:
        """Fence the job whose sockets are in the v2 group `group` as tenant uid `uid`.
        Raises OSError when nft refuses: the launch fails rather than run the job unfenced."""
        if self.missing:
            return
        self.mark_tenant(uid)  # again: the table may have been made anew since
        if name in self._rules:
            return
        assert self.mount is not None
        level = len(group.relative_to(self.mount).parts)
        path = str(group.relative_to(SYSFS_CGROUP))  # nft resolves it under /sys/fs/cgroup
        if not re.fullmatch(r"[A-Za-z0-9_.\-/]+", path):
            raise OSError(f"network fence: {path!r} is not a name nft can take")
        mark = f"{tenant_mark(uid):#x}"
        match = ("socket", "cgroupv2", "level", str(level), f'"{path}"')
        comment = ("comment", f'"{_COMMENT}{name}"')
        try:
            _nft(self.nft, "add", "rule", "inet", self.table, "out", *match, "ct", "mark", "set", mark, *comment)
            _nft(
                self.nft,
                "add", "rule", "inet", self.table, "in", *match,
                "ct", "mark", "and", f"{MARK_BIT:#x}", "==", f"{MARK_BIT:#x}", "ct", "mark", "!=", mark,
                "counter", "drop", *comment,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as err:
            self.remove(name)
            detail = str(getattr(err, "stderr", "") or err).strip()
            raise OSError(f"network fence: nft refused the rules for {name}: {detail}") from None
        self._rules.add(name)

    def _handles(self) -> dict[str, list[tuple[str, int]]]:
        """Job group name → (chain, handle) of its rules, as the kernel has them now."""
        data = json.loads(_nft(self.nft, "-j", "-a", "list", "table", "inet", self.table).stdout or "{}")
        out: dict[str, list[tuple[str, int]]] = {}
        for item in data.get("nftables", []):
            rule = item.get("rule")
            if rule and str(rule.get("comment", "")).startswith(_COMMENT) and "handle" in rule:
                name = str(rule["comment"])[len(_COMMENT) :]
                out.setdefault(name, []).append((str(rule.get("chain", "")), int(rule["handle"])))
        return out

    def remove(self, name: str) -> None:
        """The attempt ended: its rules go."""
        self._rules.discard(name)
        if self.missing:
            return
        self.keep_only(None, drop=name)

    def keep_only(self, names: set[str] | None, drop: str | None = None) -> None:
        """Delete the rules of `drop`, or of every job not in `names` (a new agent keeps those
        of the attempts it adopted: the rest are of attempts that ended while no agent ran)."""
        try:
            found = self._handles()
        except (OSError, subprocess.SubprocessError, ValueError) as err:
            log.warning("network fence: cannot list %s: %s", self.table, err)
            return
        for name, rules in found.items():
            if (drop is not None and name != drop) or (names is not None and name in names):
                continue
            for chain, handle in rules:
                try:
                    _nft(self.nft, "delete", "rule", "inet", self.table, chain, "handle", str(handle))
                except (OSError, subprocess.SubprocessError) as err:
                    log.warning("network fence: rule %d of %s not deleted: %s", handle, name, err)

    def adopt(self, jobs: dict[str, tuple[Path, int]]) -> None:
        """A new agent takes the table over: the rules of the attempts it adopted (name →
        (group, uid)) stay (made again where missing), the others' go."""
        if self.missing:
            return
        self.keep_only(set(jobs))
        try:
            present = set(self._handles())
        except (OSError, subprocess.SubprocessError, ValueError):
            present = set()
        for name, (group, uid) in jobs.items():
            if name in present:
                self._rules.add(name)
            try:
                self.add(name, group, uid)
            except OSError as err:
                log.warning("%s", err)

    @property
    def describe(self) -> str:
        if self.missing:
            return f"jobs of different tenants are NOT fenced from each other's sockets: {self.missing}"
        return "jobs of different tenants cannot connect to each other's sockets on one machine (nftables)"

    def close(self, jobs_running: bool) -> None:
        """Keep the table while jobs run (they stay fenced until the next agent); else drop it."""
        if self.missing or jobs_running:
            return
        try:
            _nft(self.nft, "delete", "table", "inet", self.table)
        except (OSError, subprocess.SubprocessError) as err:
            log.debug("network fence: table %s not deleted: %s", self.table, err)


def drop_tables_under(root: str, sysfs: Path = SYSFS_CGROUP) -> list[str]:
    """Delete the fence tables of the nodes whose v2 groups sit under the cgroup root `root`
    (for runs that made a root of their own, as tests do: their nodes never come back to
    reconcile the tables). Returns the tables deleted."""
    nft = shutil.which("nft")
    if nft is None:
        return []
    prefixes = tuple(_root_prefix(mount / root) for mount in (sysfs, sysfs / "unified"))
    return delete_tables(nft, lambda name: name.startswith(prefixes))


def net_fence(node_group: Path | None, mount: Path | None, enabled: bool = True) -> NetFence:
    """The node's fence table, made or taken over from an earlier agent (never raises: what
    cannot be done is said in `missing`)."""
    nft = shutil.which("nft")
    if not enabled:
        if nft is not None and node_group is not None:  # turned off after it was on: its table goes
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _nft(nft, "delete", "table", "inet", table_name(node_group))
                log.warning("network fence turned off: table %s deleted", table_name(node_group))
        return NetFence(missing="turned off (setting net_fence=off)")
    # nft first: without it the node's v2 network counters are not made either, and a v2-only
    # host without nft read as "no v2 tree, or no nft" (session 23's GPU machine).
    if nft is None:
        return NetFence(missing="no nft command (apt-get install nftables)")
    if node_group is None or mount is None:
        return NetFence(
            missing="jobs have no cgroup v2 group of their own (no v2 tree, or the node's v2 network "
            "counters could not be made: the node's missing KPIs say why)"
        )
    table = table_name(node_group)
    script = (
        f"add table inet {table}\n"
        f"add chain inet {table} out {{ type filter hook output priority 0; }}\n"
        f"add chain inet {table} in {{ type filter hook input priority 0; }}\n"
        f"add map inet {table} {TENANTS_MAP} {{ type uid : mark; }}\n"
        f"add chain inet {table} {UIDS_CHAIN} {{ type filter hook output priority 0; }}\n"
        f"flush chain inet {table} {UIDS_CHAIN}\n"
        f"add rule inet {table} {UIDS_CHAIN} ct mark set meta skuid map @{TENANTS_MAP}\n"
        # nft's socket lookup knows TCP and UDP only: a tenant's packet of any other protocol
        # (UDP-Lite, SCTP) delivered here could reach another tenant's socket unjudged. ICMP
        # passes (errors of a marked flow carry its mark; path MTU discovery needs them).
        f"add chain inet {table} {PROTOS_CHAIN} {{ type filter hook input priority 0; }}\n"
        f"flush chain inet {table} {PROTOS_CHAIN}\n"
        f"add rule inet {table} {PROTOS_CHAIN} meta l4proto != {{ tcp, udp, icmp, ipv6-icmp }} "
        f"ct mark and {MARK_BIT:#x} == {MARK_BIT:#x} counter drop\n"
    )
    try:
        _nft(nft, "-f", "-", stdin=script)
    except (OSError, subprocess.SubprocessError) as err:
        detail = str(getattr(err, "stderr", "") or err).strip()
        return NetFence(missing=f"nft cannot make table {table}: {detail}")
    return NetFence(table, nft, mount)
