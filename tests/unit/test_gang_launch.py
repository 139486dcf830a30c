"""Pure parts of local gangs: torchrun's variables per replica, and the shim's line prefixing."""

from __future__ import annotations

import io

from sluice.agent.launchenv import gang_env
from sluice.agent.shim import LONGEST_LINE, _write_lines


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
