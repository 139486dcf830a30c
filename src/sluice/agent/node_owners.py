"""Which agent owns each node's cgroups on this host, so that the groups of an agent that died
without closing are removed by the next agent that starts here — never a live agent's.

Why: an agent removes its node's empty groups when it closes (`node_cgroup.remove_groups`),
but a detached Ray agent is killed with its Ray cluster, and a killed process closes nothing.
Each Ray start names its nodes afresh (`ray-<node id>`), so on a long-lived host empty
`<root>/ray-*` groups piled up in every hierarchy, one set per cluster start. (nft tables have
the same problem and the same cure, keyed by the pid in their name: `node_net`.)

How: before it makes anything, an agent writes a record `<OWNERS_DIR>/<key>.json` naming
itself (pid and start time, which together name one process for its whole life) and, once
made, its node's group directories. Any agent that starts later, under a host-wide lock,
looks at the other records: where the owner is gone, it removes the recorded directories
that are empty (their empty children first — a job's group whose job ended), and the record
once none is left. A group that still holds a process (a job left running for the next
agent of that node to adopt) stays, and so does its record, for a later sweep.

Only root can write the records (the directory is 0700, each file 0600), and a sweep only
ever removes directories inside the cgroup mount (`sysfs`): a record naming anything else
is ignored. Where the directory cannot be made (not root: then no cgroups are made either),
nothing is recorded and nothing swept.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from sluice.agent.cgroup import SYSFS_CGROUP
from sluice.agent.shim import process_start_ticks, write_json_atomic

log = logging.getLogger(__name__)

OWNERS_DIR = Path("/run/sluice/node-groups")
"""Where the records live: under /run, so that they vanish on reboot with the groups."""

MAX_RECORDS = 4096
"""Most records one sweep reads (a bound on a directory someone filled by mistake)."""


class NodeInUse(RuntimeError):
    """Another live agent on this host owns the node's groups (two planes, one node name)."""


class NodeOwners:
    """The host's records of node-group owners (`directory`), for groups under `sysfs`."""

    def __init__(self, directory: Path = OWNERS_DIR, sysfs: Path = SYSFS_CGROUP) -> None:
        self.directory = directory
        self.sysfs = sysfs
        self.pid = os.getpid()
        self.start = process_start_ticks(self.pid)

    def _key(self, root: str, node: str) -> Path:
        digest = hashlib.sha256(f"{root}\0{node}".encode()).hexdigest()[:32]
        return self.directory / f"{digest}.json"

    def _ready(self) -> bool:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
        except OSError as err:
            log.debug("node group records unavailable at %s (%s): stale groups are not swept", self.directory, err)
            return False
        return True

    @contextlib.contextmanager
    def claiming(self, root: str, node: str) -> Iterator[Callable[[Iterable[Path | None]], None]]:
        """Sweep the groups of agents that are gone, claim (root, node) for this process, and
        yield a function that records the node's directories once they are made. The whole
        block holds the host-wide lock, so no sweep can see the node's new directories before
        they are recorded as a live agent's."""
        if not self._ready():
            yield lambda dirs: None
            return
        with open(self.directory / ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                held = self._read(self._key(root, node))
                if held is not None and held.get("pid") != self.pid and self._alive(held):
                    raise NodeInUse(
                        f"the cgroups of node {node!r} (under {root or 'sluice'!r}) belong to a running agent, pid "
                        f"{held.get('pid')}: another sluice plane on this host uses the same node name; give this "
                        "one a cgroup root of its own (SLUICE_CGROUP_ROOT=sluice-2) or stop the other"
                    )
                removed = self.sweep(skip=self._key(root, node))
                if removed:
                    log.info("removed %d empty cgroup(s) left by agents that are gone", len(removed))
                self._write(root, node, [])
                yield lambda dirs: self._write(root, node, [d for d in dirs if d is not None])
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def release(self, root: str, node: str) -> None:
        """Drop this process's record of (root, node) once none of its directories is left
        (called after the agent removed its empty groups on close)."""
        path = self._key(root, node)
        record = self._read(path)
        if record is None or record.get("pid") != self.pid or record.get("start") != self.start:
            return
        if not any(Path(d).exists() for d in _dirs(record)):
            path.unlink(missing_ok=True)

    def sweep(self, skip: Path | None = None) -> list[Path]:
        """Remove the empty recorded directories of every owner that is gone (see the module
        docstring); returns the directories removed."""
        removed: list[Path] = []
        try:
            records = sorted(self.directory.glob("*.json"))[:MAX_RECORDS]
        except OSError:
            return removed
        for path in records:
            if path == skip:
                continue
            record = self._read(path)
            if record is None or self._alive(record):
                continue
            left = False
            for d in _dirs(record):
                gone, stays = self._remove_empty(Path(d))
                removed.extend(gone)
                left = left or stays
            if not left:
                path.unlink(missing_ok=True)
        return removed

    def _alive(self, record: dict[str, object]) -> bool:
        pid, start = record.get("pid"), record.get("start")
        if not isinstance(pid, int) or pid <= 0:
            return False
        return process_start_ticks(pid) == start

    def _remove_empty(self, d: Path) -> tuple[list[Path], bool]:
        """rmdir `d` and its empty descendants, deepest first; (removed, whether d stays).
        Only a directory at least two levels inside the cgroup mount (`<root>/<node>`)."""
        inside = [d.relative_to(s) for s in (self.sysfs, self.sysfs.resolve()) if s in d.parents]
        if not d.is_absolute() or ".." in d.parts or not inside or len(inside[0].parts) < 2:
            log.warning("node group record names %s, not a group inside %s: ignored", d, self.sysfs)
            return [], False
        if not d.is_dir():
            return [], False
        removed: list[Path] = []
        for top, _, _ in os.walk(d, topdown=False):
            with contextlib.suppress(OSError):
                Path(top).rmdir()
                removed.append(Path(top))
        return removed, d.exists()

    def _read(self, path: Path) -> dict[str, object] | None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write(self, root: str, node: str, dirs: list[Path]) -> None:
        record = {"root": root, "node": node, "pid": self.pid, "start": self.start, "dirs": [str(d) for d in dirs]}
        try:
            write_json_atomic(self._key(root, node), record)
        except OSError as err:
            log.debug("cannot record the owner of node %s's groups (%s)", node, err)


def _dirs(record: dict[str, object]) -> list[str]:
    """The directories a record names (nothing, where it is not a list of strings)."""
    dirs = record.get("dirs")
    return [d for d in dirs if isinstance(d, str)] if isinstance(dirs, list) else []
