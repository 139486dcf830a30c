"""Pure parts of local gangs: torchrun's variables per replica, and the shim's line prefixing."""

from __future__ import annotations

import io

from sluice.agent.launchenv import gang_env
from sluice.agent.shim import LONGEST_LINE, _write_lines
from sluice.engine.local import LocalEngine
from sluice.model import Allocation, Assignment, LaunchRequest
from sluice.spec import parse_job_spec


def test_gang_env_follows_torchrun_with_nodes_as_groups() -> None:
    nodes = ["node-1", "node-0", "node-1"]
    envs = [gang_env(k, nodes, "127.0.0.1", 29500) for k in range(3)]
    got = [
        tuple(e[v] for v in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")) for e in envs
    ]
    assert got == [("0", "0", "2", "0", "2"), ("1", "0", "1", "1", "2"), ("2", "1", "2", "0", "2")]
    assert {(e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("3", "127.0.0.1", "29500")}
    assert [e["SLUICE_REPLICA"] for e in envs] == ["0", "1", "2"]


def test_write_lines_prefixes_whole_lines_and_keeps_the_rest() -> None:
    log = io.BytesIO()
    rest = _write_lines(log, b"[rank1] ", b"a\nb\r\nc")
    assert log.getvalue() == b"[rank1] a\n[rank1] b\r\n" and rest == b"c"
    log = io.BytesIO()
    assert _write_lines(log, b"[r] ", b"x" * (LONGEST_LINE + 1)) == b""
    assert log.getvalue() == b"[r] " + b"x" * (LONGEST_LINE + 1) + b"\n"


class _Agent:
    """Records what a node agent was asked to launch."""

    def __init__(self) -> None:
        self.launched: list[LaunchRequest] = []

    def launch(self, req: LaunchRequest, **_: object) -> None:
        self.launched.append(req)


def _launched_alone(replicas: dict[str, int]) -> dict[str, str]:
    engine = LocalEngine.__new__(LocalEngine)  # only its one-replica launch path is exercised
    agent = _Agent()
    engine.agents = {"node-0": agent}  # type: ignore[dict-item]
    spec = parse_job_spec({"command": ["python", "ddp.py"], "resources": {"cpu": 0.5, "replicas": replicas}})
    alloc = Allocation((Assignment("node-0", 0.5),))
    engine.launch(LaunchRequest("j-1", 1, "t", spec, alloc, "/c", env={"LR": "0.1"}))
    (req,) = agent.launched
    return req.env


def test_an_elastic_job_at_one_replica_gets_torchruns_variables_for_a_world_of_one() -> None:
    """A policy may shrink an elastic job (replicas {min: 1, max: 2}) to one replica; its
    script, written for torchrun (init_process_group over env://), still needs RANK,
    WORLD_SIZE and MASTER_*: torchrun gives them to a single worker too. Before, a job at one
    replica got none, so such a script failed at the size it was started at."""
    env = _launched_alone({"min": 1, "max": 2})
    assert env["LR"] == "0.1"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"]) == ("0", "1", "0", "127.0.0.1")
    assert env["MASTER_PORT"].isdigit() and env["SLUICE_REPLICA"] == "0"
    # a job of one replica only is not a gang: none of them, as before
    assert "RANK" not in _launched_alone({"min": 1}) and "MASTER_ADDR" not in _launched_alone({"min": 1, "max": 1})
