"""The plane's tenancy rules around isolation, over the real API and SqlStore (the engine is the
FakeEngine: no process runs here; what a launch carries is what is checked).

- Isolation off: a second non-admin tenant is refused (409, with the reason) unless forced.
- Isolation on: each tenant gets its own uid from the range, stable across a restart of the
  plane, never handed to another tenant (not even after the first is deleted), and every
  launch of its jobs carries it.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from sluice.agent.isolation import Isolation
from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.model import JobUser
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.store.sql import SqlStore
from tests.unit.fake_engine import FakeEngine

OFF = Isolation(False, "isolation is off: the plane runs as uid 1000 without CAP_SETUID")
ON = Isolation(True, "isolation is on (test: the engine is a fake)")


def _plane(home: Path, isolation: Isolation, engine: FakeEngine | None = None) -> ControlPlane:
    settings = Settings(home=home, job_uid_min=300_000, job_uid_max=300_002)
    return ControlPlane(settings, SqlStore(settings.db_url), engine or FakeEngine(), make_policy("kube"), isolation)


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_without_isolation_a_second_tenant_needs_force(tmp_path: Path) -> None:
    plane = _plane(tmp_path / "home", OFF)
    tokens = plane.bootstrap_tenants()
    with TestClient(create_app(plane)) as client:
        refused = client.post("/v1/tenants", json={"name": "alice"}, headers=_auth(tokens["admin"]))
        assert refused.status_code == 409
        assert "CAP_SETUID" in refused.text and "--force" in refused.text and "'default'" in refused.text
        assert client.post(
            "/v1/tenants", json={"name": "ops", "admin": True}, headers=_auth(tokens["admin"])
        ).is_success
        forced = client.post("/v1/tenants?force=true", json={"name": "alice"}, headers=_auth(tokens["admin"]))
        assert forced.status_code == 201 and forced.json()["name"] == "alice"
        # force is the admin's to give: a tenant's token cannot create tenants at all.
        assert (
            client.post("/v1/tenants?force=true", json={"name": "eve"}, headers=_auth(tokens["default"])).status_code
            == 403
        )
    plane.store.close()


def test_isolation_off_by_setting_says_to_change_the_setting_not_to_run_as_root(tmp_path: Path) -> None:
    # A root plane with isolation=off told the admin to "Run the plane as root".
    settings = Settings(home=tmp_path / "home", isolation="off")
    off = Isolation(False, "isolation is off (settings: isolation=off): every job runs as the plane's own user")
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"), off)
    tokens = plane.bootstrap_tenants()
    with TestClient(create_app(plane)) as client:
        refused = client.post("/v1/tenants", json={"name": "alice"}, headers=_auth(tokens["admin"]))
    assert refused.status_code == 409 and "--force" in refused.text
    assert "isolation auto or on (SLUICE_ISOLATION" in refused.text and "as root" not in refused.text, refused.text
    plane.store.close()


def test_each_tenant_has_its_own_uid_for_good_and_launches_carry_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    engine = FakeEngine()
    plane = _plane(home, ON, engine)
    tokens = plane.bootstrap_tenants()
    assert plane.job_user("admin") == JobUser(300_000, 300_000)
    assert plane.job_user("default") == JobUser(300_001, 300_001)
    with TestClient(create_app(plane)) as client:
        alice = client.post("/v1/tenants", json={"name": "alice"}, headers=_auth(tokens["admin"]))
        assert alice.status_code == 201
        job = client.post("/v1/jobs", json={"command": ["python", "t.py"]}, headers=_auth(alice.json()["token"]))
        assert job.status_code == 201
        plane.step()
        assert [(r.tenant, r.run_as) for r in engine.launched] == [("alice", JobUser(300_002, 300_002))]
        # The range (3 uids) is spent: a fourth tenant is refused with the reason.
        full = client.post("/v1/tenants", json={"name": "bob"}, headers=_auth(tokens["admin"]))
        assert full.status_code == 409 and "job_uid_min/max" in full.text
    plane.store.close()

    # A restart keeps the mapping; a deleted tenant's uid is not handed to a newcomer.
    again = _plane(home, ON)
    assert again.job_user("alice") == JobUser(300_002, 300_002)
    again.store.release_uid("default", 0.0)
    with pytest.raises(ValueError, match="spent"):  # 300_001 is released, never handed out again
        again.job_user("newcomer")
    again.store.close()


def test_state_at_rest_is_the_planes_alone(tmp_path: Path) -> None:
    from sluice.control.plane import secure_home

    home = tmp_path / "home"
    secure_home(home, OFF)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    secure_home(home, ON)
    assert stat.S_IMODE(home.stat().st_mode) == 0o711  # passable to a job's own run folder, not listable
    store = SqlStore(f"sqlite:///{home / 'sluice.db'}")
    store.append_event(0.0, "test", "a write, so the WAL exists")
    for name in ("sluice.db", "sluice.db-wal", "sluice.db-shm"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
    store.close()
