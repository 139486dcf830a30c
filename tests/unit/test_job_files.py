"""A job's files as its tenant reads them back (control/job_files.py): only the job's own parts,
reached without following a link, only regular files of the job's uid; a hostile job's links,
FIFOs and foreign files read as nothing. On a real folder (run as root, files are given to a
test uid to tell the job's own from others')."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sluice.control import job_files
from sluice.control.job_files import NoSuchFile, list_folder, open_file
from sluice.model import JobUser
from sluice.spec.errors import SpecError

JOB = JobUser(600_123, 600_123)


def _job_file(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if os.geteuid() == 0:
        os.chown(path, JOB.uid, JOB.gid)
    return path


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run folder as the agent leaves it, with a hostile job's leftovers in its HOME."""
    run = tmp_path / "runs" / "j-0123456789"
    (run / "attempt-1").mkdir(parents=True)
    (run / "attempt-1" / "state.json").write_text("{}")
    (run / "job.log").write_text("hello\n")
    (run / "job.log.attempts").write_text("1 0\n")
    _job_file(run / "work" / "model.pt", b"m" * 3000)
    _job_file(run / "work" / "out" / "result.txt", b"42\n")
    _job_file(run / "checkpoints" / "ckpt-5.pt", b"c" * 10)
    (run / "tmp").mkdir()
    secret = tmp_path / "admin.token"
    secret.write_text("plane secret")
    (run / "work" / "token").symlink_to(secret)
    (run / "work" / "etc").symlink_to("/etc")
    os.mkfifo(run / "work" / "pipe")
    (run / "work" / "roots").write_text("not the job's")  # root's: what a hard link would show
    return run


def test_the_top_shows_the_jobs_parts_never_the_planes(run: Path) -> None:
    top = list_folder(run, "", JOB)
    assert [(e.name, e.kind) for e in top.entries] == [("checkpoints", "folder"), ("tmp", "folder"), ("work", "folder")]
    for plane_part in ("attempt-1", "attempt-1/state.json", "job.log", "job.log.attempts"):
        with pytest.raises(NoSuchFile):
            open_file(run, plane_part, JOB)
    with pytest.raises(NoSuchFile):
        list_folder(run, "attempt-1", JOB)


@pytest.mark.skipif(os.geteuid() != 0, reason="tells the job's files from others' by owner: needs root to chown")
def test_links_fifos_and_foreign_files_are_nothing_and_the_jobs_own_are_read(run: Path) -> None:
    work = list_folder(run, "work", JOB)
    assert [(e.name, e.kind, e.size) for e in work.entries] == [("model.pt", "file", 3000), ("out", "folder", 0)]
    for hostile in ("work/token", "work/etc/passwd", "work/etc", "work/pipe", "work/roots"):
        started = time.monotonic()
        with pytest.raises(NoSuchFile):
            open_file(run, hostile, JOB)
        assert time.monotonic() - started < 5  # a FIFO never blocks the reader
    with pytest.raises(NoSuchFile):
        list_folder(run, "work/etc", JOB)
    fd, size = open_file(run, "work/model.pt", JOB)
    reader = job_files.FileReader(fd, size)
    assert b"".join(iter(reader.next_chunk, None)) == b"m" * 3000
    reader.close()
    assert list_folder(run, "work/out/", JOB).entries[0].name == "result.txt"
    # the HOME itself swapped for a link: nothing through it
    os.rename(run / "work", run / "work.real")
    (run / "work").symlink_to(run.parent.parent)
    with pytest.raises(NoSuchFile):
        list_folder(run, "work", JOB)
    with pytest.raises(NoSuchFile):
        open_file(run, "work/admin.token", JOB)


def test_a_folder_asked_for_as_a_file_and_a_file_as_a_folder_are_said_so(run: Path) -> None:
    """`job download ID checkpoints` said the job "has no file" there, `job files ID
    work/model.pt` "no folder": the tenant sees both in a listing, so they are named as what
    they are. A link, a FIFO or another uid's file stays the same plain nothing."""
    for folder in ("checkpoints", "work/out", "work/out/"):
        with pytest.raises(job_files.WrongKind, match="is a folder, not a file: sluice job files lists it"):
            open_file(run, folder, JOB)
    with pytest.raises(job_files.WrongKind, match=r"'work/model\.pt' is a file, not a folder: sluice job download"):
        list_folder(run, "work/model.pt", JOB)
    with pytest.raises(job_files.WrongKind, match=r"'work/model\.pt' is a file"):
        open_file(run, "work/model.pt/x", JOB)
    hidden = ["work/token", "work/etc", "work/pipe", "attempt-1"] + (["work/roots"] if os.geteuid() == 0 else [])
    for name in hidden:
        with pytest.raises(NoSuchFile) as err:
            list_folder(run, name, JOB)
        assert not isinstance(err.value, job_files.WrongKind), name
        with pytest.raises(NoSuchFile) as err:
            open_file(run, f"{name}/x", JOB)
        assert not isinstance(err.value, job_files.WrongKind), name


def test_paths_that_could_lead_out_are_refused_naming_the_field(run: Path) -> None:
    outward = ("../../admin.token", "work/../job.log", "/etc/passwd", "work/./model.pt")
    for bad in (*outward, "a\x00b", "a/" * 65, "x" * 5000):
        with pytest.raises(SpecError) as err:
            open_file(run, bad, JOB)
        assert err.value.problems[0].field == "path", bad
    with pytest.raises(NoSuchFile):
        open_file(run, "", JOB)  # the top is no file
    with pytest.raises(NoSuchFile):
        open_file(run, "work/nothing", JOB)
    with pytest.raises(NoSuchFile):
        list_folder(run.parent / "j-never", "", JOB)


def test_a_file_is_sent_as_it_was_and_closed_even_unread(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fd, size = open_file(run, "work/model.pt", None)
    with (run / "work" / "model.pt").open("ab") as f:
        f.write(b"later")  # grows after the request: not sent
    monkeypatch.setattr(job_files, "CHUNK", 1000)
    reader = job_files.FileReader(fd, size)
    chunks = list(iter(reader.next_chunk, None))
    assert [len(c) for c in chunks] == [1000, 1000, 1000]
    reader.close()
    fd, size = open_file(run, "work/model.pt", None)
    unread = job_files.FileReader(fd, size)
    unread.close()  # a client gone before the first byte
    with pytest.raises(OSError):
        os.fstat(fd)
    assert unread.next_chunk() is None


def test_a_listing_is_bounded(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(5):
        _job_file(run / "work" / "many" / f"f{i}")
    monkeypatch.setattr(job_files, "MAX_ENTRIES", 3)
    many = list_folder(run, "work/many", JOB)
    assert [e.name for e in many.entries] == ["f0", "f1", "f2"] and many.cut == 2


def test_the_api_says_which_replica_and_what_engine(tmp_path: Path) -> None:
    """Over HTTP, with the FakeEngine (it keeps no run folders): a 404 saying so; a rank the
    job does not have is a 422 naming `replica`."""
    from fastapi.testclient import TestClient

    from sluice.api.app import create_app
    from sluice.control.plane import ControlPlane
    from sluice.policy import make_policy
    from sluice.settings import Settings
    from sluice.store.sql import SqlStore

    from .fake_engine import FakeEngine

    settings = Settings(home=tmp_path / "home")
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))
    admin = {"Authorization": f"Bearer {plane.bootstrap_tenants()['admin']}"}
    try:
        with TestClient(create_app(plane)) as http:
            body = {"name": "t", "command": ["python", "t.py"], "resources": {"cpu": {"min": 1}}}
            job = http.post("/v1/jobs", json=body, headers=admin).json()["id"]
            r = http.get(f"/v1/jobs/{job}/files", headers=admin)
            assert r.status_code == 404 and "keeps no job files" in r.json()["detail"]
            r = http.get(f"/v1/jobs/{job}/files", params={"replica": 1}, headers=admin)
            assert r.status_code == 422 and r.json()["problems"][0] == {
                "field": "replica",
                "problem": f"job {job} runs one replica: give no replica (or 0)",  # not "give 0 to 0"
            }
            gang = http.post("/v1/jobs", json={**body, "resources": {"cpu": {"min": 1}, "replicas": {"min": 2}}},
                             headers=admin).json()["id"]  # fmt: skip
            r = http.get(f"/v1/jobs/{gang}/logs", params={"replica": 2}, headers=admin)
            assert r.status_code == 422 and r.json()["problems"][0]["problem"].endswith("runs 2 replicas: give 0 to 1")
            r = http.get(f"/v1/jobs/{job}/files/content", headers=admin)  # no path
            assert r.status_code == 422 and r.json()["problems"][0]["field"] == "path"
            assert http.get("/v1/jobs/j-nosuchjob/files", headers=admin).status_code == 404
    finally:
        plane.store.close()


def test_checkpoints_kept_elsewhere_are_shown_at_the_top_and_read_without_links(tmp_path: Path) -> None:
    """Ray keeps a job's checkpoints under the shared checkpoint root, not in its run folder:
    they show as `checkpoints/` all the same, read with the same care."""
    run = tmp_path / "runs" / "nodes" / "n1" / "j-1"
    _job_file(run / "work" / "model.pt")
    root = tmp_path / "checkpoints" / "j-1"
    _job_file(root / "checkpoints" / "ckpt-3.pt", b"w3")
    elsewhere = {"checkpoints": root}
    top = list_folder(run, "", None, elsewhere)
    assert [e.name for e in top.entries] == ["checkpoints", "work"]
    assert [e.name for e in list_folder(run, "checkpoints", None, elsewhere).entries] == ["ckpt-3.pt"]
    fd, size = open_file(run, "checkpoints/ckpt-3.pt", None, elsewhere)
    os.close(fd)
    assert size == 2
    os.rename(root / "checkpoints", root / "real")
    (root / "checkpoints").symlink_to(tmp_path)  # the job swapped its folder for a link
    with pytest.raises(NoSuchFile):
        list_folder(run, "checkpoints", None, elsewhere)
    assert [e.name for e in list_folder(run, "", None, elsewhere).entries] == ["work"]


def test_a_huge_folder_costs_a_listing_no_more_than_what_it_shows(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job can fill a folder with millions of empty files (no disk to speak of): a listing
    stat-ed every one of them and held every name (1M names: seconds and ~250 MiB of the API
    server, per request, as often as the tenant asked). Now it stats only the names it shows,
    holds at most those, and reads at most MAX_SCANNED names of one folder."""
    for i in range(40):
        _job_file(run / "work" / "many" / f"f{i:02d}")
    monkeypatch.setattr(job_files, "MAX_ENTRIES", 3)
    stats: list[str] = []
    real_stat = os.stat

    def counted(path: object, *args: object, **kwargs: object) -> os.stat_result:
        stats.append(str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(job_files.os, "stat", counted)
    many = list_folder(run, "work/many", JOB)
    assert [e.name for e in many.entries] == ["f00", "f01", "f02"] and many.cut == 37
    assert len(stats) <= 3, stats
    monkeypatch.setattr(job_files, "MAX_SCANNED", 10)
    many = list_folder(run, "work/many", JOB)
    assert len(many.entries) == 3 and len(many.entries) + many.cut == 10


def test_a_tenant_has_a_bounded_number_of_listings_in_progress(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each listing holds one of the API's worker threads while it reads a folder the job
    filled as it liked: one tenant's many at once took them all (every tenant's requests
    waited). Past MAX_LISTINGS_PER_TENANT in progress: a 429, that tenant's only."""
    import threading

    from fastapi.testclient import TestClient

    from sluice.api.app import create_app
    from sluice.api.routes import job_files as routes
    from sluice.control.plane import ControlPlane
    from sluice.policy import make_policy
    from sluice.settings import Settings
    from sluice.spec import TenantSpec
    from sluice.store.sql import SqlStore

    from .fake_engine import FakeEngine

    class Folders(FakeEngine):
        def run_folder(self, job_id: str, rank: int = 0) -> str | None:
            return str(run)

        def remove_run_folders(self, job_id: str) -> int:
            return 0

        def still_running(self, job_ids: object) -> list[str]:
            return []

    settings = Settings(home=tmp_path / "home")
    plane = ControlPlane(settings, SqlStore(settings.db_url), Folders(), make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    admin_rec = plane.store.get_tenant("admin")
    assert admin_rec is not None
    _, alice = plane.create_tenant(admin_rec, TenantSpec(name="alice"), force=True)
    slow = threading.Event()
    real = job_files.list_folder

    def held(*args: object) -> job_files.Listing:
        slow.wait(10)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(job_files, "list_folder", held)
    try:
        with TestClient(create_app(plane)) as http:
            body = {"name": "t", "command": ["python", "t.py"], "resources": {"cpu": {"min": 1}}}
            job = http.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {alice}"}).json()["id"]

            def listing(token: str) -> int:
                url = f"/v1/jobs/{job}/files"
                return http.get(url, params={"path": "work"}, headers={"Authorization": f"Bearer {token}"}).status_code

            codes: list[int] = []
            busy = [
                threading.Thread(target=lambda: codes.append(listing(alice)))
                for _ in range(routes.MAX_LISTINGS_PER_TENANT)
            ]
            for t in busy:
                t.start()
            deadline = time.monotonic() + 10
            while getattr(http.app.state, "listings", {}).get("alice", 0) < len(busy):
                assert time.monotonic() < deadline, "the listings never started"
                time.sleep(0.02)
            assert listing(alice) == 429
            slow.set()
            for t in busy:
                t.join(10)
            assert codes == [200] * len(busy)
            assert listing(alice) == 200  # the slots came back
            assert listing(tokens["admin"]) == 200
    finally:
        slow.set()
        plane.store.close()


def test_a_name_too_long_for_any_folder_is_refused_naming_the_field(run: Path) -> None:
    """A name longer than a folder entry can be (255 bytes) reached os.open as a folder's
    step, whose ENAMETOOLONG was no 'no such folder': a 500 and a traceback in the server's
    log, as often as asked. Now a 422 naming `path`, as any path that cannot name a file."""
    for bad in ("work/" + "a" * 256 + "/x", "work/" + "a" * 256, "work/" + "é" * 128):
        for call in (list_folder, open_file):
            with pytest.raises(SpecError) as err:
                call(run, bad, JOB)
            assert err.value.problems[0].field == "path", bad
    with pytest.raises(NoSuchFile):
        open_file(run, "work/" + "a" * 255, JOB)  # as long as a name may be: just not there


def test_a_name_that_is_not_utf8_is_left_out_not_the_whole_listing(run: Path) -> None:
    """A job names a file with bytes that are no UTF-8 (b'bad\\xff'): its folder's listing
    could not be written as JSON, a 500 for its tenant and for an admin alike, whatever else
    the folder held. Such a name is left out (no path over HTTP could name it anyway)."""
    bad = os.fsencode(run / "work") + b"/bad\xff"
    _job_file(Path(os.fsdecode(bad)))
    os.mkdir(os.fsencode(run / "work") + b"/dir\xfe")
    work = list_folder(run, "work", None)
    for e in work.entries:
        e.name.encode("utf-8")  # a lone surrogate here was the 500
    assert "model.pt" in [e.name for e in work.entries]


def test_the_cli_writes_only_its_own_part_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sluice job download --to DIR/model.pt` wrote through whatever `DIR/model.pt.part` was:
    a link another user planted in a shared folder (/tmp, where fs.protected_symlinks is 0)
    had the job's bytes written over the file it names (~/.bashrc), and a file of that name
    already there was truncated and then removed, --force or not. Now the part file is made
    afresh (never through a link, never over a file): one that is there stops the download,
    untouched."""
    import contextlib
    from collections.abc import Iterator
    from typing import BinaryIO

    from typer.testing import CliRunner

    from sluice.cli import job as job_cli
    from sluice.cli.main import app as cli

    class Client:
        def download(self, job_id: str, path: str, out: BinaryIO, *, replica: int | None = None) -> int:
            out.write(b"the job's bytes")
            return 15

    @contextlib.contextmanager
    def connect(admin: bool = False) -> Iterator[Client]:
        yield Client()

    monkeypatch.setattr(job_cli, "connect_for_job", connect)
    victim = tmp_path / "bashrc"
    victim.write_text("mine")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "model.pt.part").symlink_to(victim)
    r = CliRunner().invoke(cli, ["job", "download", "j-0123456789", "work/model.pt", "--to", str(shared / "model.pt")])
    assert victim.read_text() == "mine", r.output
    assert r.exit_code != 0 and "model.pt.part" in r.output and not (shared / "model.pt").exists()
    assert (shared / "model.pt.part").is_symlink()  # not ours to remove
    (shared / "model.pt.part").unlink()
    (shared / "model.pt.part").write_text("someone's")
    r = CliRunner().invoke(cli, ["job", "download", "j-0123456789", "work/model.pt", "--to", str(shared)])
    assert r.exit_code != 0 and (shared / "model.pt.part").read_text() == "someone's", r.output
    (shared / "model.pt.part").unlink()
    r = CliRunner().invoke(cli, ["job", "download", "j-0123456789", "work/model.pt", "--to", str(shared)])
    assert r.exit_code == 0, r.output
    assert (shared / "model.pt").read_bytes() == b"the job's bytes" and not (shared / "model.pt.part").exists()


def test_a_download_that_came_short_is_an_error_not_a_file(tmp_path: Path) -> None:
    """The server sends a file up to the size it had when asked (X-File-Size) and, when the
    job shrinks it meanwhile (rewrites its checkpoint), ends early with no error to tell: the
    client wrote the short file and `sluice job download` said it had. Now a short download is
    a SluiceError naming what came, and the CLI keeps no file."""
    import io

    import httpx

    from sluice.client import Client, SluiceError

    def short(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"X-File-Size": "10"}, content=b"12345")

    def whole(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"X-File-Size": "5"}, content=b"12345")

    out = io.BytesIO()
    with (
        Client("http://sluice.invalid", "t", transport=httpx.MockTransport(short)) as c,
        pytest.raises(SluiceError) as err,
    ):
        c.download("j-0123456789", "work/model.pt", out)
    assert "5 of 10 bytes" in str(err.value)
    with Client("http://sluice.invalid", "t", transport=httpx.MockTransport(whole)) as c:
        assert c.download("j-0123456789", "work/model.pt", io.BytesIO()) == 5

    import contextlib
    from collections.abc import Iterator

    from typer.testing import CliRunner

    from sluice.cli import job as job_cli
    from sluice.cli.main import app as cli

    @contextlib.contextmanager
    def connect(admin: bool = False) -> Iterator[Client]:
        with Client("http://sluice.invalid", "t", transport=httpx.MockTransport(short)) as c:
            yield c

    mp = pytest.MonkeyPatch()
    mp.setattr(job_cli, "connect_for_job", connect)
    try:
        dest = tmp_path / "model.pt"
        r = CliRunner().invoke(cli, ["job", "download", "j-0123456789", "work/model.pt", "--to", str(dest)])
    finally:
        mp.undo()
    assert r.exit_code == 1 and "came short" in r.output, r.output
    assert not dest.exists() and not (tmp_path / "model.pt.part").exists()
