"""Durability on a real full file system: the control plane's SQLite database lives on a
small tmpfs that the test fills up. (A file system cannot be remounted read-only under an
open database — the kernel refuses while files are open for writing — so a read-only home
is tested where it happens: at start-up, see tests of `sluice up`.)

What must hold: a write that cannot be made is answered 503 with the reason and nothing of it
is kept; reads keep working; every job acknowledged before is still there, once; the round
pauses instead of losing engine events; when space comes back everything carries on.

The engine is the FakeEngine (no processes): this test is about the store, and the local
engine's jobs would write their runs onto the same full disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.model import JobStarted, Phase
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.store import StoreUnavailable
from sluice.store.sql import SqlStore

from ..unit.fake_engine import FakeEngine

pytestmark = pytest.mark.integration


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to make a small tmpfs")
    where = tmp_path / "fs"
    where.mkdir()
    try:
        _mount("-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(where))
    except subprocess.CalledProcessError as err:
        pytest.skip(f"cannot mount a tmpfs here: {err.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True, timeout=30)


def _fill(where: Path) -> Path:
    """Write until the file system says ENOSPC; the file to delete to make room again."""
    filler = where / "filler"
    # Unbuffered: a buffered file's close flushed what the last write could not, and raised
    # ENOSPC at the end of the block whenever the free space was not a multiple of a write.
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    # SQLite may still squeeze a page into the last few bytes: take those as well.
    with contextlib.suppress(OSError), (where / "crumbs").open("wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 512)
    return filler


def _body(name: str) -> dict[str, object]:
    return {"name": name, "command": ["python", "train.py"], "resources": {"cpu": 0.5}}


def test_a_full_disk_loses_nothing_and_answers_503(small_fs: Path, tmp_path: Path) -> None:
    settings = Settings(home=small_fs / "home", policy="kube")
    settings.home.mkdir()
    engine = FakeEngine()
    plane = ControlPlane(settings, SqlStore(settings.db_url), engine, make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    auth = {"Authorization": f"Bearer {tokens['default']}"}
    with TestClient(create_app(plane)) as client:
        acked = []
        for i in range(3):
            r = client.post("/v1/jobs", json=_body(f"before-{i}"), headers=auth)
            assert r.status_code == 201, r.text
            acked.append(r.json()["id"])
        plane.step()  # admitted and placed

        filler = _fill(small_fs)
        r = client.post("/v1/jobs", json=_body("during"), headers=auth)
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "unavailable" and "full" in r.json()["detail"]
        # Reads keep working, and show exactly what was acknowledged.
        listed = client.get("/v1/jobs", headers=auth)
        assert listed.status_code == 200
        assert sorted(j["id"] for j in listed.json()["items"]) == sorted(acked)
        assert client.get(f"/v1/jobs/{acked[0]}", headers=auth).status_code == 200
        # A round that must write pauses instead of dropping the engine's news.
        started = next(r for r in engine.launched if r.job_id == acked[0])
        engine.pending.append(JobStarted(acked[0], started.attempt, "n0", engine.now))
        with pytest.raises(StoreUnavailable):
            plane.step()
        assert plane.controller.book.get(acked[0]).phase == Phase.STARTING  # type: ignore[union-attr]
        cancel = client.post(f"/v1/jobs/{acked[1]}/cancel", headers=auth)
        assert cancel.status_code == 503

        filler.unlink()
        (small_fs / "crumbs").unlink(missing_ok=True)
        plane.step()  # the kept event is applied now
        assert plane.controller.book.get(acked[0]).phase == Phase.RUNNING  # type: ignore[union-attr]
        r = client.post("/v1/jobs", json=_body("after"), headers=auth)
        assert r.status_code == 201, r.text
        acked.append(r.json()["id"])

    plane.store.close()
    # A fresh control plane on the same database sees every acknowledged job, once.
    again = SqlStore(settings.db_url)
    stored = [j.id for j in again.list_jobs()]
    assert sorted(stored) == sorted(acked) and len(stored) == len(set(stored))
    names = {j.spec.name for j in again.list_jobs()}
    assert "during" not in names
    again.close()
