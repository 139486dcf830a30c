"""Ray's own node membership, turned into sluice nodes and NodeUp/NodeLost events.

Ray is the authority on which nodes exist (its GCS health-checks raylets); sluice only
reads `ray.nodes()` and diffs it. A sluice node is named by the Ray label `sluice.node`
when the operator sets one (`ray start --labels='{"sluice.node": "gpu-a"}'`), so a
machine that restarts comes back under the same name and is used again; otherwise by
`ray-` and the first 12 hex digits of its Ray node id.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.model import NodeInfo, NodeLost, NodeUp

log = logging.getLogger("sluice.engine.ray")

NAME_LABEL = "sluice.node"
"""Ray node label that names the sluice node."""


@dataclass(frozen=True)
class RayNode:
    node_id: str
    name: str
    address: str
    cpu: float
    gpus: int = 0
    memory_mb: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    def info(self) -> NodeInfo:
        return NodeInfo(self.name, self.cpu, self.gpus, self.memory_mb, dict(self.labels))


def node_name(raw: Mapping[str, Any]) -> str:
    labels = raw.get("Labels") or {}
    return str(labels.get(NAME_LABEL) or f"ray-{str(raw['NodeID'])[:12]}")


def live_nodes(
    raw_nodes: Iterable[Mapping[str, Any]],
    known: Mapping[str, str] | None = None,
    left_out: list[RayNode] | None = None,
) -> dict[str, RayNode]:
    """name -> node for every node Ray reports alive (entries of `ray.nodes()`).

    Two live nodes with one name (a `sluice.node` label given to two raylets) cannot both be
    that sluice node: the one `known` by that name (name -> Ray node id) keeps it, else the
    first listed; the others go to `left_out` (no agent, no jobs) until the name is free."""
    out: dict[str, RayNode] = {}
    for raw in raw_nodes:
        if not raw.get("Alive"):
            continue
        res = raw.get("Resources") or {}
        labels = {str(k): str(v) for k, v in (raw.get("Labels") or {}).items()}
        node = RayNode(
            node_id=str(raw["NodeID"]),
            name=node_name(raw),
            address=str(raw.get("NodeManagerAddress", "")),
            cpu=float(res.get("CPU", 0.0)),
            gpus=int(res.get("GPU", 0)),
            memory_mb=int(float(res.get("memory", 0.0)) // (1024 * 1024)),
            labels=labels,
        )
        have = out.get(node.name)
        if have is not None:
            if (known or {}).get(node.name) == node.node_id:
                have, node = node, have
                out[have.name] = have
            if left_out is not None:
                left_out.append(node)
            continue
        out[node.name] = node
    return out


class Membership:
    """The nodes seen last time, and what changed since."""

    def __init__(self) -> None:
        self.nodes: dict[str, RayNode] = {}
        self._warned: set[str] = set()
        """Ray node ids already warned about as left out (a name another live node has)."""

    def update(self, raw_nodes: Iterable[Mapping[str, Any]], now: float) -> list[NodeUp | NodeLost]:
        left_out: list[RayNode] = []
        current = live_nodes(raw_nodes, {name: n.node_id for name, n in self.nodes.items()}, left_out)
        for node in left_out:
            if node.node_id not in self._warned:
                self._warned.add(node.node_id)
                other = current[node.name]
                log.warning(
                    "Ray node %s (%s) is labelled %s=%s like live node %s (%s): it is left out (no agent, "
                    "no jobs) until that one is gone; give each Ray node a label of its own",
                    node.node_id[:12], node.address, NAME_LABEL, node.name, other.node_id[:12], other.address,
                )  # fmt: skip
        events: list[NodeUp | NodeLost] = []
        for name, old in self.nodes.items():
            now_there = current.get(name)
            if now_there is None:
                events.append(NodeLost(name, now, "the Ray node is no longer alive"))
            elif now_there.node_id != old.node_id:
                # Same name, new raylet: the old one died in between.
                events.append(NodeLost(name, now, "the Ray node restarted"))
        for name, new in current.items():
            before = self.nodes.get(name)
            if before is None or before.node_id != new.node_id:
                events.append(NodeUp(name, now, new.cpu, new.gpus, new.memory_mb, dict(new.labels)))
        self.nodes = current
        return events
