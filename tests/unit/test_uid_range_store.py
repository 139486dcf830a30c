"""The uid-range registry compares stores by what they are, not how their URL reads (red team
s22: two planes with SLUICE_HOME=h started from different folders, two databases, one range,
both started)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from sluice.agent.uid_ranges import UidRangeInUse
from sluice.settings import Settings


def test_two_planes_with_one_relative_home_name_are_two_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice import server
    from sluice.agent import uid_ranges

    ranges = tmp_path / "ranges"
    monkeypatch.setattr(server, "claim_uid_range", functools.partial(uid_ranges.claim_uid_range, directory=ranges))
    claims = []
    for plane in ("a", "b"):
        (tmp_path / plane / "h").mkdir(parents=True)
        monkeypatch.chdir(tmp_path / plane)
        s = Settings(home=Path("h"), job_uid_min=500_200, job_uid_max=500_299)
        if not server.isolation_status(s).enabled:
            pytest.skip("tenant isolation is off here (not root): no range is claimed")
        if plane == "a":
            claims.append(server.claim_tenant_uids(s))
        else:
            with pytest.raises(UidRangeInUse, match=r"overlaps 500200\.\.500299 of the plane of .*/a/h "):
                server.claim_tenant_uids(s)
    claims[0].release()


def test_the_store_key_keeps_one_database_one_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.agent.uid_ranges import store_of

    monkeypatch.chdir(tmp_path)
    assert store_of("sqlite:///x/sluice.db") == store_of(f"sqlite:///{tmp_path}/x/sluice.db")
    assert store_of("sqlite://") == "sqlite://"
    assert store_of("postgresql://u:secret@db.example/sluice") == "postgresql://u:***@db.example/sluice"
