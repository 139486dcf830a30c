"""Cache work done as a tenant's own uid: warm, drop and report one tenant's cache folders.

Under tenant isolation each tenant's jobs read and fill cache folders of their own
(`…/cache/uid-<uid>/`, `/dev/shm/sluice-…/uid-<uid>/`: 0700, the tenant's uid), so that no
tenant reads bytes another tenant's job cached (docs/security.md). The plane and the node
agents run as root and never open a path in a folder a job can change (a job could swap its
index for a symlink to the plane's database), so what `sluice dataset warm`, `rm` and `list`
must do *inside* such a folder is done here, in a short process started as that tenant's uid
(`sluice.agent.tenant_cache` starts it): it can do nothing the tenant's own jobs could not.

`python -m sluice.data.cache_ops` reads one JSON request on stdin (never argv: storage
options may hold credentials, and every uid may read every process's command line) and
writes one JSON answer as the last line of stdout (`{"failed": why}` if it could not):

- `{"op": "warm", "disk_dir", "memory_dir", "memory_bytes", "disk_bytes", "node", "name",
  "source", "storage_options", "generation", "workers", "guard": {"roots": [...],
  "allow_hosts": [...]}}` → a WarmReport (the cache sized to the tenant's share first);
- `{"op": "drop", "disk_dir", "memory_dir", "name"}` → `{"removed": n}`;
- `{"op": "fractions", "disk_dir", "memory_dir"[, "memory_bytes", "disk_bytes"]}` →
  `{"fractions": {folder: share}}`; a tier sized above the bytes given is shrunk to them
  first (the tenant's share of the node, `agent.tenant_cache.tenant_share`);
- `{"op": "list", "source", "storage_options", "guard"}` → `{"items": n, "total_bytes": b}`:
  `dataset create`'s listing of a local source, with the tenant's own file permissions (the
  plane, as root, would count the files of folders the tenant may not open, and an error
  would name them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

from sluice.data.cache import DISK, MEMORY, DatasetCache, index_fractions
from sluice.data.guard import SourceGuard
from sluice.data.index import Index
from sluice.data.settings import CacheSettings
from sluice.data.source import Source
from sluice.data.warm import warm_node

OPS = ("warm", "drop", "fractions", "list")


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Do one request (see the module docstring) in this process, as whoever runs it."""
    op = request.get("op")
    if op == "list":
        manifest = Source(
            str(request["source"]),
            request.get("storage_options") or {},
            retries=1,
            backoff_s=0.1,
            guard=_guard(request),
        ).list()
        return {"items": len(manifest), "total_bytes": manifest.total_bytes}
    disk, memory = str(request["disk_dir"]), str(request["memory_dir"])
    if op == "fractions":
        # A report creates nothing and never grows a tier; it only shrinks one above the share.
        path = os.path.join(disk, "index.sqlite")
        if not os.path.exists(path):
            return {"fractions": {}}
        index = Index(path, CacheSettings().lrfu_lambda)
        _shrink_to(index, disk, memory, request)
        return {"fractions": {ds: frac for (ds, _name), frac in index_fractions(index).items()}}
    # Sized to the tenant's share where the request gives one (a warm), else as it stands.
    cache = DatasetCache(
        disk_dir=disk,
        memory_dir=memory,
        memory_bytes=_share(request, "memory_bytes"),
        disk_bytes=_share(request, "disk_bytes"),
    )
    if op == "drop":
        return {"removed": cache.remove(str(request["name"]))}
    if op == "warm":
        guard = _guard(request)
        report = warm_node(
            cache,
            str(request["node"]),
            str(request["name"]),
            str(request["source"]),
            request.get("storage_options") or {},
            int(request.get("workers", 16)),
            guard=guard,
            generation=str(request.get("generation", "")),
        )
        cache.drain()
        return dataclasses.asdict(report)
    raise ValueError(f"op: {op!r} is not one of {', '.join(OPS)}")


def _share(request: dict[str, Any], key: str) -> int | None:
    """A tier size the request gives (bytes, ≥ 0), or None."""
    value = request.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key}: {value!r} is not a number of bytes")
    return value


def _shrink_to(index: Index, disk: str, memory: str, request: dict[str, Any]) -> None:
    """Shrink each tier of the cache sized above the request's share to it (its least valuable
    items go); never grow one, nor touch a cache within its share."""
    usage = index.usage()
    now = {tier: usage[tier][1] for tier in (MEMORY, DISK) if tier in usage}
    target = dict(now)
    for tier, key in ((MEMORY, "memory_bytes"), (DISK, "disk_bytes")):
        share = _share(request, key)
        if share is not None and tier in target:
            target[tier] = min(target[tier], share)
    if target != now:  # both sizes given, so opening it grows neither to the environment's
        cache = DatasetCache(
            disk_dir=disk, memory_dir=memory, memory_bytes=target.get(MEMORY), disk_bytes=target.get(DISK)
        )
        cache.drain()


def _guard(request: dict[str, Any]) -> SourceGuard:
    g = request.get("guard") or {}
    return SourceGuard(tuple(g.get("roots", ())), tuple(g.get("allow_hosts", ())))


def main() -> int:
    try:
        answer = run(json.loads(sys.stdin.read()))
        code = 0
    except Exception as err:  # the caller reports it as this node's error
        answer, code = {"failed": f"{type(err).__name__}: {err}"}, 1
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
