"""The plane's liveness actor (`sluice-plane-alive-<token>`) is pinned to the plane's own Ray
node. Walkthrough s30: Ray put it on a worker node (w2); `kill -9` of w2's raylet ended it, and
a second plane with another home was then given the namespace while the first still ran: both
drove the same agents (docs/ray.md, "One plane per namespace")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from sluice.engine.ray_claim import Claim, PlaneAlive


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


class _Handle:
    def __init__(self, instance: Any) -> None:
        for name in ("ping", "get", "take", "hold", "release"):
            if hasattr(instance, name):
                setattr(self, name, _Method(getattr(instance, name)))


class _Remote:
    def __init__(self, cls: type, made: list[tuple[type, dict[str, Any]]]) -> None:
        self.cls, self.made = cls, made

    def options(self, **opts: Any) -> _Remote:
        self.opts = opts
        return self

    def remote(self) -> _Handle:
        self.made.append((self.cls, self.opts))
        return _Handle(self.cls())


class _Context:
    def get_node_id(self) -> str:
        return "cd" * 28


class _Ray:
    def __init__(self) -> None:
        self.made: list[tuple[type, dict[str, Any]]] = []

    def remote(self, cls: type) -> _Remote:
        return _Remote(cls, self.made)

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        return ref

    def get_runtime_context(self) -> _Context:
        return _Context()


def test_the_liveness_actor_is_pinned_to_the_plane_s_own_node(tmp_path: Path) -> None:
    ray = _Ray()
    Claim(ray, "ns", tmp_path)
    (opts,) = [o for cls, o in ray.made if cls is PlaneAlive]
    where = opts.get("scheduling_strategy")
    assert isinstance(where, NodeAffinitySchedulingStrategy)
    assert where.node_id == "cd" * 28 and where.soft is False
