"""A detached node agent found by name keeps what the plane that created it gave it: a plane
started with another `job_python` (or fence, grace period, shared root) must not go on
launching with the old one's. Found by a user who, told by `sluice up` that tenant uids cannot
run the job interpreter, set SLUICE_JOB_PYTHON and restarted: every job still failed with the
old interpreter on every Ray node."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from sluice.engine.ray import AGENT_PREFIX, RayEngine
from sluice.engine.ray_membership import RayNode


class _Call:
    def __init__(self, value: Any) -> None:
        self.value = value

    def remote(self, *args: Any) -> Any:
        return self.value


class _Ref:
    """What a call returns, as an ObjectRef would: hashable, read through `get`."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _RayCall:
    def __init__(self, agent: _Agent) -> None:
        self.agent = agent

    def remote(self, fn: Any) -> Any:
        return _Ref(fn(self.agent))


class _Agent:
    """An agent as the plane reaches it; one of an older sluice (no `created_with`) has no
    `unfinished` either, only `alive`: asked for `unfinished` directly, its worker would die."""

    def __init__(self, created_with: dict[str, Any] | None, unfinished: list[str]) -> None:
        if created_with is not None:  # an agent of a sluice from before it was kept has none
            self._created_with = created_with
            self.unfinished = lambda: list(unfinished)
        self.alive = lambda: {job: 1 for job in unfinished}
        self.__ray_call__ = _RayCall(self)
        self.close = _Call(None)


class _Ray:
    def __init__(self, actors: dict[str, _Agent]) -> None:
        self.actors = actors
        self.killed: list[_Agent] = []

    def get_actor(self, name: str, namespace: str | None = None) -> _Agent:
        if name not in self.actors:
            raise ValueError(name)
        return self.actors[name]

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        return ref.value if isinstance(ref, _Ref) else ref

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> tuple[list[Any], list[Any]]:
        return refs, []

    def kill(self, actor: _Agent, no_restart: bool = True) -> None:
        self.killed.append(actor)
        self.actors = {k: v for k, v in self.actors.items() if v is not actor}


class _ActorClass:
    def __init__(self, ray: _Ray) -> None:
        self.ray, self.made = ray, []  # type: ignore[var-annotated]

    def options(self, **opts: Any) -> _ActorClass:
        self.name = opts["name"]
        return self

    def remote(self, node: str, cpu: float, runs_dir: str = "", **kw: Any) -> _Agent:
        kw.setdefault("runs_dir", runs_dir)  # positional before this fix
        agent = _Agent({"runs_dir": kw["runs_dir"], "settings": kw["settings"], "cache": kw["cache"]}, [])
        self.made.append(agent)
        self.ray.actors.setdefault(self.name, agent)  # get_if_exists
        return self.ray.actors[self.name]


NODE = RayNode(node_id="ab" * 28, name="w1", address="10.0.0.2", cpu=1.0, gpus=0, memory_mb=0, labels={})


def _engine(tmp_path: Path, existing: _Agent | None) -> tuple[RayEngine, _Ray, _ActorClass]:
    ray = _Ray({AGENT_PREFIX + NODE.node_id: existing} if existing else {})
    engine = RayEngine.__new__(RayEngine)  # no cluster: only what _agent_for touches
    engine._ray = ray  # type: ignore[assignment]
    engine._actor_cls = cls = _ActorClass(ray)
    engine.namespace, engine.call_timeout_s = "ns", 1.0
    engine.runs_root = tmp_path / "runs"
    engine.agent_settings = {"job_python": "/good/python", "stop_grace_s": 30.0}
    engine.agent_cache = {"disk_dir": "/c"}
    return engine, ray, cls


def _old(tmp_path: Path, **settings: Any) -> dict[str, Any]:
    return {
        "runs_dir": str(tmp_path / "runs" / "nodes" / "w1"),
        "settings": {"job_python": "/good/python", "stop_grace_s": 30.0, **settings},
        "cache": {"disk_dir": "/c"},
    }


def test_an_idle_agent_created_with_other_settings_is_replaced(tmp_path: Path) -> None:
    old = _Agent(_old(tmp_path, job_python="/root/venv/python"), [])
    engine, ray, _cls = _engine(tmp_path, old)
    agent = engine._agent_for(NODE)
    assert ray.killed == [old]
    assert agent is not old and agent._created_with["settings"]["job_python"] == "/good/python"


def test_an_agent_created_with_the_same_settings_is_kept(tmp_path: Path) -> None:
    same = _Agent(_old(tmp_path), ["j-1"])
    engine, ray, cls = _engine(tmp_path, same)
    assert engine._agent_for(NODE) is same
    assert ray.killed == [] and cls.made == []


def test_a_busy_agent_created_with_other_settings_is_kept_and_said_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    busy = _Agent(_old(tmp_path, job_python="/root/venv/python"), ["j-1"])
    engine, ray, _cls = _engine(tmp_path, busy)
    with caplog.at_level(logging.WARNING, logger="sluice.engine.ray"):
        assert engine._agent_for(NODE) is busy
    assert ray.killed == []
    assert "node w1: its agent was created with another job_python than this plane's" in caplog.text


def test_a_new_node_gets_an_agent_made_with_this_plane_s(tmp_path: Path) -> None:
    engine, _ray, cls = _engine(tmp_path, None)
    agent = engine._agent_for(NODE)
    assert cls.made == [agent] and agent._created_with == _old(tmp_path)


def test_an_idle_agent_of_an_older_sluice_is_replaced(tmp_path: Path) -> None:
    old = _Agent(None, [])
    engine, ray, _cls = _engine(tmp_path, old)
    agent = engine._agent_for(NODE)
    assert ray.killed == [old] and agent._created_with == _old(tmp_path)


def test_a_busy_agent_of_an_older_sluice_is_asked_only_what_it_knows_and_kept(tmp_path: Path) -> None:
    old = _Agent(None, ["j-1"])
    engine, ray, _cls = _engine(tmp_path, old)
    assert engine._agent_for(NODE) is old and ray.killed == []
    engine._agents = {"w1": old}
    assert engine.still_running(["j-1", "j-2"]) == ["j-1"]  # `job delete` asks it the same way


def test_config_diff_names_what_differs() -> None:
    from sluice.engine.ray import config_diff

    want = {"runs_dir": "/a", "settings": {"job_python": "p", "net_fence": "auto"}, "cache": {}}
    assert config_diff(want, want) == []
    have = {"runs_dir": "/b", "settings": {"job_python": "q", "net_fence": "auto"}, "cache": {"x": 1}}
    assert config_diff(have, want) == ["runs_dir (ray_shared_root)", "job_python", "cache"]
    assert config_diff({}, want) == ["settings (an agent that cannot say which)"]


def test_a_found_agent_tells_its_last_polls_exits_again_to_the_new_plane(tmp_path: Path) -> None:
    """The answer to a poll in flight dies with its plane: the agent that outlives it must tell
    those exits again, unmarked, to the plane that finds it (NodeAgent.retell); one of an older
    sluice, which has none, is asked nothing it lacks."""
    told: list[int] = []

    class _NodeAgent:
        def retell(self) -> int:
            told.append(1)
            return 1

    found = _Agent(_old(tmp_path), [])
    found._agent = _NodeAgent()  # type: ignore[attr-defined]
    engine, ray, _cls = _engine(tmp_path, found)
    assert engine._agent_for(NODE) is found and told == [1] and ray.killed == []
    older = _Agent(_old(tmp_path), [])  # its NodeAgent has no retell
    older._agent = object()  # type: ignore[attr-defined]
    engine, ray, _cls = _engine(tmp_path, older)
    assert engine._agent_for(NODE) is older and ray.killed == []
