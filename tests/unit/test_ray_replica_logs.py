"""Every replica's log of a Ray gang (`?all_replicas=true`) is found in one listing of the runs
folder, and one read of them all returns at most MAX_LOG_BYTES (red team s22)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.engine.ray import RayEngine
from sluice.engine.ray_gang import GangBook


def _engine(root: Path) -> RayEngine:
    engine = RayEngine.__new__(RayEngine)  # only the runs folder; no cluster
    engine.runs_root, engine._log_paths, engine._gangs, engine._agents = root, {}, GangBook(), {}
    return engine


def _log(root: Path, node: str, name: str, mtime: float) -> str:
    p = root / "nodes" / node / name / "job.log"
    p.parent.mkdir(parents=True)
    p.write_text(name)
    os.utime(p, (mtime, mtime))
    return str(p)


def test_every_replica_s_log_is_found_in_one_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jid = "j-0123456789"
    old = _log(tmp_path, "n0", f"{jid}--r1of2", 100)  # an earlier attempt at another world size
    logs = [_log(tmp_path, f"n{k % 3}", f"{jid}--r{k}of4", 200 + k) for k in range(4)]
    _log(tmp_path, "n1", f"{jid}x--r1of4", 300)  # another job whose id starts with this one's
    _log(tmp_path, "n1", f"{jid}--r9of16", 300)  # past the world asked for
    for j in range(50):
        (tmp_path / "nodes" / "n2" / f"j-{j:010x}").mkdir()
    engine = _engine(tmp_path)
    assert engine.replica_logs(jid, 4) == logs
    assert engine.replica_logs(jid, 6) == [*logs, None, None]
    assert engine.replica_logs(jid, 2) == logs[:2] and old not in logs
    assert engine.replica_logs(jid, 4) == [engine.replica_log(jid, k) for k in range(4)]

    listings = []
    real_glob = Path.glob

    def counted(self: Path, pattern: str) -> object:
        listings.append(pattern)
        return real_glob(self, pattern)

    monkeypatch.setattr(Path, "glob", counted)
    assert engine.replica_logs(jid, 1024)[:4] == logs  # a gang of the most replicas a spec may ask
    assert len(listings) == 1, listings
