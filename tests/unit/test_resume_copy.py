"""`--resume-from` copies the old job's checkpoints as the plane (root, under isolation) from
a folder the old job's uid owns. A job could plant there a link to the plane's admin token or
to another tenant's files, and the copy — made readable to the new job — would hand it over.
The copy takes only regular files of the tenant's own uid, never through a link."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fastapi.testclient import TestClient

from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.control.resume import copy_checkpoints
from sluice.model import JobUser
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import TenantSpec
from sluice.store.sql import SqlStore
from tests.isolating import needs_root

from .fake_engine import FakeEngine


@dataclass
class Resuming:
    """A plane (fake engine) where tenant alice has a cancelled job `old` and its checkpoint
    folder, made and handed to her uid as her job would have left it."""

    plane: ControlPlane
    http: TestClient
    auth: dict[str, str]
    alice: Any
    old: str
    folder: Path
    user: JobUser

    def resume(self) -> Any:
        """Submit a job resuming from `old`; the API's answer."""
        body = {"command": ["python", "t.py"], "resume_from": self.old}
        return self.http.post("/v1/jobs", json=body, headers=self.auth)


@contextlib.contextmanager
def resuming(settings: Settings) -> Iterator[Resuming]:
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    admin = plane.authenticate(tokens["admin"])
    _, token = plane.create_tenant(admin, TenantSpec(name="alice"))
    alice = plane.authenticate(token)
    auth = {"Authorization": f"Bearer {token}"}
    try:
        with TestClient(create_app(plane)) as http:
            r = http.post("/v1/jobs", json={"command": ["python", "t.py"]}, headers=auth)
            old = r.json()["id"]
            assert http.post(f"/v1/jobs/{old}/cancel", headers=auth).status_code == 200
            folder = Path(plane.controller.checkpoint_dir(plane.get_job(alice, old)))
            folder.mkdir(parents=True)
            user = plane.job_user("alice")
            os.chown(folder, user.uid, user.gid)
            yield Resuming(plane, http, auth, alice, old, folder, user)
    finally:
        plane.store.close()


def test_the_newest_checkpoints_are_copied_0600(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for step in (3, 12, 7):
        (src / f"ckpt-{step}.pt").write_bytes(b"w" * step)
    (src / "ckpt-99.pt.tmp").write_bytes(b"half")
    got = copy_checkpoints(str(src), str(tmp_path / "dst"), keep=2)
    assert got == (str(tmp_path / "dst" / "ckpt-12.pt"), 12)
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["ckpt-12.pt", "ckpt-7.pt"]
    assert (tmp_path / "dst" / "ckpt-12.pt").read_bytes() == b"w" * 12
    assert stat.S_IMODE((tmp_path / "dst" / "ckpt-12.pt").stat().st_mode) == 0o600


@pytest.mark.parametrize("plant", ["link", "fifo", "folder-link"])
def test_a_planted_link_or_fifo_is_never_followed(tmp_path: Path, plant: str) -> None:
    secret = tmp_path / "admin.token"
    secret.write_text("the plane's secret")
    src = tmp_path / "src"
    if plant == "folder-link":
        real = tmp_path / "elsewhere"
        real.mkdir()
        (real / "ckpt-5.pt").write_text("x")
        src.symlink_to(real)
    else:
        src.mkdir()
        if plant == "link":
            (src / "ckpt-9.pt").symlink_to(secret)
        else:
            os.mkfifo(src / "ckpt-9.pt")
    try:
        got = copy_checkpoints(str(src), str(tmp_path / "dst"))
    except OSError:
        got = None
    assert got is None  # refused, or (a linked folder) no checkpoint found: nothing copied
    assert not (tmp_path / "dst").exists() or not list((tmp_path / "dst").iterdir())


@needs_root
def test_only_the_tenants_own_files_are_copied_and_the_copy_is_its_own(tmp_path: Path) -> None:
    alice = JobUser(231_201, 231_201)
    src = tmp_path / "src"
    src.mkdir()
    (src / "ckpt-4.pt").write_bytes(b"root's file")  # not alice's: a hard link she could not make
    with pytest.raises(OSError, match="not the job's own file"):
        copy_checkpoints(str(src), str(tmp_path / "dst"), owner=alice)
    os.chown(src / "ckpt-4.pt", alice.uid, alice.gid)
    got = copy_checkpoints(str(src), str(tmp_path / "dst2"), owner=alice)
    assert got is not None
    st = os.stat(got[0])
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice.uid, 0o600)


@needs_root
def test_resume_from_a_job_that_planted_a_link_to_the_admin_token_is_refused(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    with resuming(settings) as rs:
        (rs.folder / "ckpt-9.pt").symlink_to(settings.home / "admin.token")  # what her job could do
        r = rs.resume()
        assert r.status_code == 409, r.text
        assert "could not copy" in r.text
        new_folders = [p for p in (settings.home / "runs").glob("*/checkpoints/ckpt-9.pt") if p.parent != rs.folder]
        assert new_folders == []
        # her job's own checkpoint is copied, and the copy is hers
        (rs.folder / "ckpt-9.pt").unlink()
        (rs.folder / "ckpt-10.pt").write_bytes(b"weights")
        os.chown(rs.folder / "ckpt-10.pt", rs.user.uid, rs.user.gid)
        r = rs.resume()
        assert r.status_code == 201, r.text
        copy = Path(rs.plane.controller.checkpoint_dir(rs.plane.get_job(rs.alice, r.json()["id"]))) / "ckpt-10.pt"
        assert copy.read_bytes() == b"weights" and copy.stat().st_uid == rs.user.uid


def test_a_tenant_deleted_while_its_resume_copies_gets_no_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy runs outside the controller's lock (it may take a while); a delete of the
    tenant in that time used to let the job be created afterwards, for a tenant that no longer
    exists, and run."""
    import sluice.control.plane as plane_module
    from sluice.control.errors import NotFound
    from sluice.spec import parse_job_spec

    settings = Settings(home=tmp_path / "home", isolation="off")
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    admin = plane.authenticate(tokens["admin"])
    _, token = plane.create_tenant(admin, TenantSpec(name="carol"), force=True)
    carol = plane.authenticate(token)
    try:
        old = plane.submit(carol, parse_job_spec({"command": ["python", "t.py"]}))
        plane.cancel(carol, old.id)

        def slow_copy(src: str, dst: str, *args: object, **kw: object) -> tuple[str, int]:
            plane.delete_tenant(admin, "carol")  # lands while the checkpoint is being copied
            return (f"{dst}/ckpt-3.pt", 3)

        monkeypatch.setattr(plane_module, "copy_checkpoints", slow_copy)
        with pytest.raises(NotFound, match="deleted while"):
            plane.submit(carol, parse_job_spec({"command": ["python", "t.py"], "resume_from": old.id}))
        assert [j.id for j in plane.store.list_jobs()] == [old.id]
    finally:
        plane.store.close()


def test_a_sparse_checkpoint_above_the_bound_is_refused_before_a_byte_is_copied(tmp_path: Path) -> None:
    """A sparse file costs its tenant nothing and the plane copies as root (red team s18 F3)."""
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "ckpt-5.pt", "wb") as f:
        f.truncate(64 << 20)
    with pytest.raises(OSError, match=r"ckpt-5\.pt is 64\.0 MiB \(67108864 bytes\), more than the 1\.0 MiB"):
        copy_checkpoints(str(src), str(tmp_path / "dst"), max_bytes=1 << 20)
    assert not (tmp_path / "dst").exists() or not list((tmp_path / "dst").iterdir())


def test_a_sparse_checkpoint_is_copied_sparse(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "ckpt-5.pt", "wb") as f:
        f.write(b"head")
        f.seek(32 << 20)
        f.write(b"tail")
        f.truncate(48 << 20)
    got = copy_checkpoints(str(src), str(tmp_path / "dst"), max_bytes=48 << 20)
    assert got is not None
    copy = Path(got[0])
    assert copy.stat().st_size == 48 << 20
    assert copy.stat().st_blocks * 512 < 4 << 20  # the holes were not written out
    with open(copy, "rb") as f:
        assert f.read(4) == b"head"
        f.seek(32 << 20)
        assert f.read(4) == b"tail"


@needs_root
def test_resume_of_a_checkpoint_above_resume_max_copy_mb_is_a_409_naming_both(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", resume_max_copy_mb=1)
    with resuming(settings) as rs:
        with open(rs.folder / "ckpt-5.pt", "wb") as f:
            f.truncate(1 << 30)  # 1 GiB, no block on disk
        os.chown(rs.folder / "ckpt-5.pt", rs.user.uid, rs.user.gid)
        r = rs.resume()
        assert r.status_code == 409, r.text
        assert "1.0 GiB" in r.text and "1.0 MiB" in r.text and "resume_max_copy_mb" in r.text
        assert list((settings.home / "runs").glob("*/checkpoints/ckpt-5.pt")) == [rs.folder / "ckpt-5.pt"]


def test_resume_copies_at_once_are_bounded_and_one_more_is_a_429(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new job does not exist while its checkpoints are copied, so the cap on a tenant's
    unfinished jobs did not count copies: one tenant's parallel resumes each copied up to
    resume_max_copy_mb, as root, and held an API thread each. Here the copy is held open
    (a stand-in for a long one) to have several under way at once."""
    import sluice.control.plane as plane_module

    settings = Settings(home=tmp_path / "home", isolation="off", resume_copies_per_tenant=2, resume_copies=3)
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))
    admin = plane.authenticate(plane.bootstrap_tenants()["admin"])
    auth, old = {}, {}
    for name in ("carol", "dave"):
        _, token = plane.create_tenant(admin, TenantSpec(name=name), force=True)
        auth[name] = {"Authorization": f"Bearer {token}"}
    release, started = threading.Event(), threading.Semaphore(0)
    failing = threading.Event()

    def held_copy(src: str, dst: str, *args: object, **kw: object) -> tuple[str, int]:
        if failing.is_set():
            raise OSError("disk full")
        started.release()
        assert release.wait(30)
        return (f"{dst}/ckpt-3.pt", 3)

    monkeypatch.setattr(plane_module, "copy_checkpoints", held_copy)
    try:
        with TestClient(create_app(plane)) as http, ThreadPoolExecutor(4) as pool:
            for name in auth:
                old[name] = http.post("/v1/jobs", json={"command": ["python", "t.py"]}, headers=auth[name]).json()["id"]
                assert http.post(f"/v1/jobs/{old[name]}/cancel", headers=auth[name]).status_code == 200

            def resume(name: str) -> Any:
                body = {"command": ["python", "t.py"], "resume_from": old[name]}
                return http.post("/v1/jobs", json=body, headers=auth[name])

            under_way = [pool.submit(resume, "carol"), pool.submit(resume, "carol")]
            assert started.acquire(timeout=30) and started.acquire(timeout=30)
            third = resume("carol")
            assert third.status_code == 429 and third.headers["retry-after"] == "5", third.text
            assert "resume_copies_per_tenant" in third.json()["detail"]
            under_way.append(pool.submit(resume, "dave"))  # another tenant's still runs...
            assert started.acquire(timeout=30)
            fourth = resume("dave")  # ...up to the plane's bound
            assert fourth.status_code == 429 and "setting resume_copies)" in fourth.json()["detail"], fourth.text
            release.set()
            assert [f.result(timeout=30).status_code for f in under_way] == [201, 201, 201]
            # Every slot is given back, by a copy that failed too.
            failing.set()
            assert [resume("carol").status_code for _ in range(3)] == [409, 409, 409]
            failing.clear()
            assert resume("carol").status_code == 201
        assert len(plane.store.list_jobs()) == 2 + 4
    finally:
        plane.store.close()


def test_a_resume_copy_counts_against_max_disk_mb_and_one_at_the_cap_is_refused(tmp_path: Path) -> None:
    """A `--resume-from` submit writes the copy into the new job's folder before the job runs:
    it counts against its tenant's max_disk_mb from then (as the job's disk_mb, kept if it is
    cancelled unrun), and at or past the cap the submit is a 409 before a byte is copied (red
    team s29: a held tenant could copy 64 GiB a submit, none of it counted, without end)."""
    from sluice.spec.queue import TenantPatch

    settings = Settings(home=tmp_path / "home")
    with resuming(settings) as rs:
        admin = next(t for t in rs.plane.store.list_tenants() if t.admin)
        rs.plane.update_tenant(admin, "alice", TenantPatch(max_disk_mb=5))
        (rs.folder / "ckpt-10.pt").write_bytes(os.urandom(3 << 20))
        os.chown(rs.folder / "ckpt-10.pt", rs.user.uid, rs.user.gid)
        first = rs.resume()
        assert first.status_code == 201, first.text
        assert 3.0 <= first.json()["disk_mb"] < 3.1
        second = rs.resume()  # 3 MiB held, under 5: copied
        assert second.status_code == 201, second.text
        assert rs.http.post(f"/v1/jobs/{second.json()['id']}/cancel", headers=rs.auth).status_code == 200
        third = rs.resume()  # 6 MiB held, the cancelled copy's included
        assert third.status_code == 409, third.text
        assert "max_disk_mb of 5 MiB" in third.text and "sluice job delete" in third.text
        assert len(list((settings.home / "runs").glob("*/checkpoints/ckpt-10.pt"))) == 3  # the old and 2 copies
        # deleting the cancelled copy makes room for one more
        assert rs.http.delete(f"/v1/jobs/{second.json()['id']}", headers=rs.auth).status_code == 200
        assert rs.resume().status_code == 201


@pytest.mark.parametrize("where", ["local", "memory://"])
def test_a_checkpoint_name_past_the_largest_step_is_no_checkpoint(tmp_path: Path, where: str) -> None:
    """ckpt-<30 digits>.pt was taken as the newest checkpoint, and its step, past 64 bits, went
    into the new job's record (sdkwalk, s32)."""
    if where == "local":
        src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
        os.makedirs(src)
    else:
        src, dst = f"memory://sdkwalk-{tmp_path.name}/src", f"memory://sdkwalk-{tmp_path.name}/dst"
    fs, root = fsspec.core.url_to_fs(src)
    for name in ("ckpt-12.pt", "ckpt-" + "9" * 30 + ".pt", f"ckpt-{2**53 + 1}.pt"):
        with fs.open(f"{root}/{name}", "wb") as f:
            f.write(b"w")
    got = copy_checkpoints(src, dst, keep=2)
    assert got is not None and got[1] == 12 and got[0].endswith("/ckpt-12.pt")


@needs_root
def test_resume_from_a_job_that_planted_a_huge_step_starts_from_its_real_checkpoint(tmp_path: Path) -> None:
    """The job whose record held that step could never be saved: it stayed Pending, its cancel
    was a 500, and every round logged two tracebacks (sdkwalk, s32)."""
    settings = Settings(home=tmp_path / "home")
    with resuming(settings) as rs:
        for name in ("ckpt-10.pt", "ckpt-" + "9" * 30 + ".pt"):
            (rs.folder / name).write_bytes(b"weights")
            os.chown(rs.folder / name, rs.user.uid, rs.user.gid)
        r = rs.resume()
        assert r.status_code == 201, r.text
        new = r.json()["id"]
        assert rs.plane.get_job(rs.alice, new).checkpoint_step == 10
        rs.plane.step()
        assert rs.http.post(f"/v1/jobs/{new}/cancel", headers=rs.auth).status_code == 200
