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


def test_uids_tenants_were_given_under_an_earlier_range_are_claimed_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A home whose job_uid_min/max was moved (the old range now another plane's) started, and
    ran its old tenants' jobs as uids inside the other live plane's range: only the settings
    were compared (new-user walk s30)."""
    from sluice import server
    from sluice.agent import uid_ranges
    from sluice.store.sql import SqlStore

    ranges = tmp_path / "ranges"
    monkeypatch.setattr(server, "claim_uid_range", functools.partial(uid_ranges.claim_uid_range, directory=ranges))
    a = Settings(home=tmp_path / "a", job_uid_min=500_200, job_uid_max=500_299)
    b = Settings(home=tmp_path / "b", job_uid_min=600_000, job_uid_max=600_099)
    if not server.isolation_status(a).enabled:
        pytest.skip("tenant isolation is off here (not root): no range is claimed")
    for s in (a, b):
        s.home.mkdir()
    store = SqlStore(b.db_url)
    assert store.assign_uid("alice", 500_250, 500_299, 1.0) == 500_250  # b's range, before it was moved
    store.close()
    claim = server.claim_tenant_uids(a)
    try:
        with pytest.raises(UidRangeInUse, match=r"and 500250\.\.500250 that its tenants already run as"):
            server.claim_tenant_uids(b)
    finally:
        claim.release()
    server.claim_tenant_uids(b).release()  # once a is gone, b starts: its range is its own


def test_the_span_of_uids_live_tenants_run_as(tmp_path: Path) -> None:
    from sluice.store.memory import MemoryStore
    from sluice.store.sql import SqlStore

    for store in (MemoryStore(), SqlStore(f"sqlite:///{tmp_path}/s.db")):
        assert store.live_uid_span() is None
        store.assign_uid("a", 1000, 1999, 1.0)
        store.assign_uid("b", 1000, 1999, 2.0)
        store.assign_uid("c", 3000, 3999, 3.0)  # given under a later range
        assert store.live_uid_span() == (1000, 3000)
        store.release_uid("a", 4.0)
        store.release_uid("c", 4.0)
        assert store.live_uid_span() == (1001, 1001)
        store.close()
