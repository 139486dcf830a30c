"""`RayEngine.close`: a one-node Ray instance the plane started closes its node agents before
it stops, so what they made on the host goes with them; a joined cluster's agents live on."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.engine.ray import RayEngine


class _Method:
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def remote(self) -> str:
        self.calls.append(self.name)
        return self.name


class _Agent:
    def __init__(self, node: str, calls: list[str]) -> None:
        self.close = _Method(f"close {node}", calls)


class _Ray:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def is_initialized(self) -> bool:
        return True

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        self.calls.append(f"get {sorted(refs)}")
        return refs

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def _engine(owned: bool, calls: list[str]) -> RayEngine:
    engine = RayEngine.__new__(RayEngine)  # no cluster: only what close() touches
    engine._ray = _Ray(calls)  # type: ignore[assignment]
    engine._agents = {"n0": _Agent("n0", calls), "n1": _Agent("n1", calls)}
    engine._inflight = {}
    engine._claim = None
    engine.owned = owned
    engine.call_timeout_s = 1.0
    return engine


@pytest.mark.parametrize("owned", [True, False])
def test_an_owned_instance_closes_its_agents_before_it_stops(owned: bool) -> None:
    # `sluice down` of `sluice up --engine ray` (no address) left the node agent's nft tables
    # behind: `inet sluice_net_<pid>_0` (swept by the next agent) and its network fence's
    # `inet sluice_fence_<root>_<node>`, which stayed for good: the next instance's node has
    # another name. The actor died with the instance, unclosed.
    calls: list[str] = []
    _engine(owned, calls).close()
    if owned:
        assert calls == ["close n0", "close n1", "get ['close n0', 'close n1']", "shutdown"]
    else:  # a joined cluster's agents keep running, with their jobs
        assert calls == ["shutdown"]
