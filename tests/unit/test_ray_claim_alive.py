"""The plane's liveness actor (`sluice-plane-alive-<token>`) is pinned to the plane's own Ray
node. Walkthrough s30: Ray put it on a worker node (w2); `kill -9` of w2's raylet ended it, and
a second plane with another home was then given the namespace while the first still ran: both
drove the same agents (docs/ray.md, "One plane per namespace")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from sluice.engine.base import EngineTaken
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

    def wait(self, refs: list[Any], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Any], list[Any]]:
        return refs, []

    def get_runtime_context(self) -> _Context:
        return _Context()


def test_a_renewal_that_finds_another_plane_holding_the_namespace_stops_this_one(tmp_path: Path) -> None:
    """The record lives in a detached actor that is lost with its node (restarted empty); a
    plane started in that gap takes the namespace. The first plane's renewals used to be fire
    and forget, and it went on driving the same agents beside the second; the renewal after
    one that found another owner raises EngineTaken, naming that plane."""
    ray = _Ray()
    claim = Claim(ray, "ns", tmp_path)
    claim.hold()
    claim.hold()  # both found it ours
    other = {"plane_id": "p2", "home": "/other/home", "host": "h2", "pid": 7, "alive": "a2"}
    record = claim._actor
    record.release.remote(dict(claim.me.__dict__))  # lost with its node: restarted empty ...
    assert record.take.remote(other, None)  # ... and the second plane took it in the gap
    claim.hold()  # this renewal finds it taken; it is looked at by the next one
    with pytest.raises(EngineTaken, match=r"another plane \(home /other/home on h2, pid 7\) took the Ray namespace"):
        claim.hold()


def test_the_liveness_actor_is_pinned_to_the_plane_s_own_node(tmp_path: Path) -> None:
    ray = _Ray()
    Claim(ray, "ns", tmp_path)
    (opts,) = [o for cls, o in ray.made if cls is PlaneAlive]
    where = opts.get("scheduling_strategy")
    assert isinstance(where, NodeAffinitySchedulingStrategy)
    assert where.node_id == "cd" * 28 and where.soft is False
