"""Job retention (control/retention.py, engine/run_folders.py): an ended job is forgotten —
record, events, run folders — `job_retention_days` after it finished, except one a live job
waits for and an array not all ended; folders go without following a job's links."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.control.retention import DAY_S, Retention, forgettable
from sluice.engine.local import LocalEngine
from sluice.engine.run_folders import remove_job_folders
from sluice.model import JobExited, JobRecord, JobStarted, Phase
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import JobSpec
from sluice.store.base import HeldTime, hour_of
from sluice.store.memory import MemoryStore
from sluice.store.sql import SqlStore

from .fake_engine import FakeEngine

SPEC = JobSpec.model_validate({"name": "t", "command": ["python", "t.py"], "resources": {"cpu": {"min": 1}}})


def job(job_id: str, phase: Phase = Phase.SUCCEEDED, finished: float | None = 10.0, **spec: object) -> JobRecord:
    s = SPEC.model_copy(update=spec) if spec else SPEC
    return JobRecord(id=job_id, tenant="alice", spec=s, phase=phase, finished_at=finished if phase.terminal else None)


def array_job(
    array_id: str, index: int, count: int, phase: Phase = Phase.SUCCEEDED, finished: float = 10.0
) -> JobRecord:
    arr = SPEC.model_validate({**SPEC.model_dump(), "array": {"count": count}}).array
    assert arr is not None
    return job(f"{array_id}-{index}", phase, finished, array=arr.model_copy(update={"id": array_id, "index": index}))


# ---------------------------------------------------------------- what is forgotten


def test_a_job_a_live_job_starts_after_is_kept_and_the_others_go() -> None:
    waits = job("waiting", Phase.PENDING, after=["dep"])
    ids, kept = forgettable([job("dep"), job("other")], [waits], cutoff=100.0, get=lambda _: None)
    assert ids == ["other"] and kept == 1


def test_a_job_a_live_job_starts_after_any_way_is_kept_too() -> None:
    waits = job("waiting", Phase.PENDING, after_any=["dep"])
    ids, kept = forgettable([job("dep", Phase.FAILED), job("other")], [waits], cutoff=100.0, get=lambda _: None)
    assert ids == ["other"] and kept == 1


def test_an_array_goes_whole_only_once_every_job_of_it_ended_before_the_cutoff() -> None:
    jobs = {j.id: j for j in (array_job("a", 0, 3), array_job("a", 1, 3), array_job("a", 2, 3, finished=500.0))}
    ids, kept = forgettable([jobs["a-0"], jobs["a-1"]], [], cutoff=100.0, get=jobs.get)
    assert ids == [] and kept == 1  # a-2 ended after the cutoff: all three stay
    jobs["a-2"] = array_job("a", 2, 3, finished=50.0)
    ids, kept = forgettable([jobs["a-0"]], [], cutoff=100.0, get=jobs.get)
    assert ids == ["a-0", "a-1", "a-2"] and kept == 0  # members past the page go with it
    running = {**jobs, "a-1": array_job("a", 1, 3, Phase.RUNNING)}
    assert forgettable([jobs["a-0"]], [], cutoff=100.0, get=running.get) == ([], 1)


def test_an_array_with_a_live_job_is_kept_without_reading_its_ended_jobs() -> None:
    """An array with a job not ended was judged by reading every job of it from the store,
    under the controller's lock, pass after pass: a tenant's arrays of 1,000 jobs, one left
    running in each, cost a thousand record reads each. A live job (the book has it) keeps
    its array at once; otherwise reading stops at the first job that keeps it."""
    jobs = {j.id: j for j in (array_job("a", k, 1000) for k in range(1000))}
    running = array_job("a", 999, 1000, Phase.RUNNING)
    jobs["a-999"] = running
    reads: list[str] = []

    def get(job_id: str) -> JobRecord | None:
        reads.append(job_id)
        return jobs.get(job_id)

    assert forgettable([jobs["a-0"]], [running], cutoff=100.0, get=get) == ([], 1)
    assert len(reads) <= 1, len(reads)
    reads.clear()
    jobs["a-5"] = array_job("a", 5, 1000, finished=500.0)  # ended after the cutoff
    jobs["a-999"] = array_job("a", 999, 1000)
    assert forgettable([jobs["a-0"]], [], cutoff=100.0, get=get) == ([], 1)
    assert len(reads) <= 6, len(reads)


def test_an_array_a_live_job_waits_for_is_kept_whole() -> None:
    jobs = {j.id: j for j in (array_job("a", 0, 2), array_job("a", 1, 2))}
    for after in (["a"], ["a-1"]):
        waits = job("w", Phase.PENDING, after=after)
        assert forgettable(list(jobs.values()), [waits], cutoff=100.0, get=jobs.get) == ([], 1)


def _retention(store: MemoryStore, live: list[JobRecord] | None = None, **kw: int) -> tuple[Retention, list[str]]:
    removed: list[str] = []

    def remove(job_id: str) -> int:
        removed.append(job_id)
        return 1

    r = Retention(
        store,
        keep_s=DAY_S,
        live=lambda: list(live or []),
        get=store.get_job,
        lock=threading.RLock(),
        remove_folders=remove,
        **kw,  # type: ignore[arg-type]
    )
    return r, removed


def test_a_pass_forgets_jobs_past_their_time_with_their_events_folders_and_old_node_events() -> None:
    store = MemoryStore()
    now = 10 * DAY_S
    for jid, at in (("old", now - 2 * DAY_S), ("recent", now - 0.5 * DAY_S)):
        store.create_job(job(jid, finished=at))
        store.append_event(at, "phase", f"{jid} ended", job_id=jid)
    store.create_job(job("live", Phase.RUNNING))
    store.append_event(now - 3 * DAY_S, "health", "n0 cordoned", node="n0")
    store.append_event(now - 0.1 * DAY_S, "health", "n0 healthy", node="n0")
    retention, removed = _retention(store)

    done = retention.run(now)

    assert (done.jobs, done.events, done.folders, done.kept, done.more) == (1, 1, 1, 0, False)
    assert store.get_job("old") is None and store.events(job_id="old") == [] and removed == ["old"]
    assert store.get_job("recent") is not None and store.get_job("live") is not None
    assert [e.message for e in store.events(node="n0")] == ["n0 healthy"]
    note = store.events(kinds=["retention"])
    assert len(note) == 1 and "forgot 1 jobs" in note[0].message and "removed 1 run folders" in note[0].message
    again = retention.run(now)  # nothing left: no second note
    assert (again.jobs, again.events) == (0, 0) and len(store.events(kinds=["retention"])) == 1


def test_a_pass_that_forgot_jobs_says_so_to_whoever_sums_their_disk() -> None:
    """A tenant's disk cap sums its ended jobs' folders; once retention forgot some, that sum is
    read again at once, not up to 30 s later (red team s29)."""
    store = MemoryStore()
    store.create_job(job("old", finished=1.0))
    told: list[int] = []
    retention, _ = _retention(store, forgot=lambda: told.append(1))  # type: ignore[arg-type]
    retention.run(10 * DAY_S)
    assert told == [1]
    retention.run(10 * DAY_S)  # nothing forgotten: nothing said
    assert told == [1]


def _kept_then_late(late: int) -> tuple[MemoryStore, list[str], JobRecord]:
    """Four ended jobs a pending job waits for (kept), finished first; then `late` free ones."""
    store = MemoryStore()
    deps = [f"dep{i}" for i in range(4)]
    for i, jid in enumerate(deps):
        store.create_job(job(jid, finished=float(i)))
    for i in range(late):
        store.create_job(job(f"late{i}", finished=100.0 + i))
    return store, deps, job("w", Phase.PENDING, after=deps)


def test_kept_jobs_do_not_stall_a_pass_behind_them_and_a_pass_is_bounded() -> None:
    """Candidates come earliest-finished first, a page at a time: a page of kept ones (waited
    for) must not hide the later ones; a pass stops at its bound and says more is left."""
    store, deps, waiting = _kept_then_late(late=6)
    now = 10 * DAY_S
    retention, _ = _retention(store, [waiting], batch=2, most_per_pass=8)
    first = retention.run(now)
    assert (first.jobs, first.kept, first.more) == (4, 4, True)
    second = retention.run(now)
    assert (second.jobs, second.more) == (2, False)
    assert sorted(j.id for j in store.list_jobs()) == sorted(deps)


def test_zero_days_keeps_everything_and_a_negative_keep_is_refused(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", job_retention_days=0, usage_retention_days=0)
    plane = ControlPlane(settings, SqlStore(settings.db_url), FakeEngine(), make_policy("kube"))
    try:
        assert plane.retention is None
    finally:
        plane.store.close()
    with pytest.raises(ValueError, match="positive"):
        Retention(MemoryStore(), 0, live=list, get=lambda _: None, lock=threading.Lock())
    with pytest.raises(ValueError, match="negative"):
        Retention(MemoryStore(), DAY_S, live=list, get=lambda _: None, lock=threading.Lock(), usage_keep_s=-1)
    with pytest.raises(ValueError, match="job_retention_days"):
        Settings(home=tmp_path / "h2", job_retention_days=-1)
    with pytest.raises(ValueError, match="usage_retention_days"):
        Settings(home=tmp_path / "h2", usage_retention_days=-1)


def test_held_time_goes_after_its_own_window_and_jobs_kept_for_ever_stay() -> None:
    """Usage's held time grew for ever (two rows a tenant-hour); it goes past
    usage_retention_days, whole hours, while jobs (kept for ever here: 0 days) stay."""
    store = MemoryStore()
    now = 500 * DAY_S
    old, recent = hour_of(now - 401 * DAY_S), hour_of(now - 399 * DAY_S)
    store.add_held_time([HeldTime(t, old, g, 3600, 3600) for t in ("alice", "bob") for g in (False, True)])
    store.add_held_time([HeldTime("alice", recent, True, 60, 60)])
    store.create_job(job("ancient", finished=1.0))
    retention = Retention(
        store, 0, live=list, get=store.get_job, lock=threading.Lock(), usage_keep_s=400 * DAY_S, batch=2
    )
    done = retention.run(now)
    assert (done.jobs, done.held_rows) == (0, 4), done
    assert store.held_time() == [HeldTime("alice", 0.0, True, 60, 60)]
    assert store.get_job("ancient") is not None
    (note,) = store.events(kinds=["retention"])
    assert note.message == "deleted 4 rows of held time past the usage window" and note.data["held_rows"] == 4
    assert retention.run(now).held_rows == 0


# ---------------------------------------------------------------- through the plane


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[tuple[ControlPlane, FakeEngine, TestClient, dict[str, str]]]:
    settings = Settings(home=tmp_path / "home", job_retention_days=1)
    engine = FakeEngine()
    plane = ControlPlane(settings, SqlStore(settings.db_url), engine, make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    with TestClient(create_app(plane)) as client:
        yield plane, engine, client, {"Authorization": f"Bearer {tokens['admin']}"}
    plane.store.close()


def test_a_cancelled_job_is_gone_from_the_api_a_day_after_and_a_live_one_stays(
    plane: tuple[ControlPlane, FakeEngine, TestClient, dict[str, str]],
) -> None:
    cp, engine, client, admin = plane
    body = {"name": "t", "command": ["python", "t.py"], "resources": {"cpu": {"min": 1}}}
    ended = client.post("/v1/jobs", json=body, headers=admin).json()["id"]
    live = client.post("/v1/jobs", json=body, headers=admin).json()["id"]
    assert client.post(f"/v1/jobs/{ended}/cancel", headers=admin).status_code == 200
    assert cp.retention is not None
    engine.now += 0.9 * DAY_S
    assert cp.retention.retention.run(engine.now).jobs == 0  # not yet its time
    assert client.get(f"/v1/jobs/{ended}", headers=admin).status_code == 200
    engine.now += 0.2 * DAY_S
    assert cp.retention.retention.run(engine.now).jobs == 1
    assert client.get(f"/v1/jobs/{ended}", headers=admin).status_code == 404
    assert client.get(f"/v1/jobs/{live}", headers=admin).status_code == 200
    listed = [j["id"] for j in client.get("/v1/jobs", headers=admin).json()["items"]]
    assert listed == [live]
    # a job that starts after a forgotten one is refused like one after a job never made
    refused = client.post("/v1/jobs", json={**body, "after": [ended]}, headers=admin)
    assert refused.status_code == 422 and "after.0" in refused.text


def test_a_job_forgotten_between_the_after_check_and_the_submit_is_refused_not_cancelled(
    plane: tuple[ControlPlane, FakeEngine, TestClient, dict[str, str]],
) -> None:
    """`after` was checked under the controller's lock, then the lock let go until the job was
    made: a retention pass in between forgot the predecessor, and the job was accepted (201)
    only to be cancelled at once, "ended and is gone". It is checked again where it is made."""
    cp, engine, client, admin = plane
    body = {"name": "t", "command": ["python", "t.py"], "resources": {"cpu": {"min": 1}}}
    dep = client.post("/v1/jobs", json=body, headers=admin).json()["id"]
    cp.step()
    job = cp.controller.book.get(dep)
    assert job is not None and job.allocation is not None
    engine.pending.append(JobStarted(dep, job.attempt, job.allocation.nodes[0], engine.now))
    cp.step()
    engine.pending.append(JobExited(dep, job.attempt, engine.now, 0, retryable=False))
    cp.step()
    assert client.get(f"/v1/jobs/{dep}", headers=admin).json()["phase"] == "Succeeded"
    engine.now += 2 * DAY_S
    assert cp.retention is not None
    resolve = cp.priorities.resolve

    def pass_between(spec: JobSpec) -> JobSpec:  # the retention thread takes the lock here
        cp.retention.retention.run(engine.now)  # type: ignore[union-attr]
        return resolve(spec)

    cp.priorities.resolve = pass_between  # type: ignore[method-assign]
    r = client.post("/v1/jobs", json={**body, "after": [dep]}, headers=admin)
    cp.priorities.resolve = resolve  # type: ignore[method-assign]
    assert cp.controller.book.get(dep) is None  # the pass did run between
    assert r.status_code == 422 and "after.0" in r.text, r.text
    assert [j["id"] for j in client.get("/v1/jobs", headers=admin).json()["items"]] == []


def test_a_plane_that_lost_its_database_to_another_forgets_nothing(
    plane: tuple[ControlPlane, FakeEngine, TestClient, dict[str, str]],
) -> None:
    """A plane whose database another plane took (StoreInUse: its reconcile loop stopped, it
    "no longer acts on its jobs") went on forgetting jobs every hour, judged against its own
    stale book: a job the other plane's live jobs start after could go, and with it its
    folders. It forgets nothing once it lost the database."""
    cp, engine, client, admin = plane
    body = {"name": "t", "command": ["python", "t.py"], "resources": {"cpu": {"min": 1}}}
    ended = client.post("/v1/jobs", json=body, headers=admin).json()["id"]
    assert client.post(f"/v1/jobs/{ended}/cancel", headers=admin).status_code == 200
    engine.now += 2 * DAY_S
    cp.lost_database = "another control plane holds the database"
    assert cp.retention is not None
    assert cp.retention.retention.run(engine.now).jobs == 0
    assert client.get(f"/v1/jobs/{ended}", headers=admin).status_code == 200


def test_a_plane_that_lost_its_database_changes_nothing_for_anyone_and_still_answers_reads(
    plane: tuple[ControlPlane, FakeEngine, TestClient, dict[str, str]],
) -> None:
    """Its book is stale once another plane took the database: a submit, cancel or delete judged
    against it could act on what it no longer knows (red team s29: only delete was refused)."""
    cp, _engine, client, admin = plane
    body = {"name": "t", "command": ["python", "t.py"], "resources": {"cpu": {"min": 1}}}
    queued = client.post("/v1/jobs", json=body, headers=admin).json()["id"]
    cp.lost_database = "another control plane holds the database"
    for method, url, payload in (
        ("POST", "/v1/jobs", body),
        ("POST", f"/v1/jobs/{queued}/cancel", None),
        ("DELETE", f"/v1/jobs/{queued}", None),
        ("PATCH", "/v1/tenants/default", {"weight": 2}),
    ):
        r = client.request(method, url, json=payload, headers=admin)
        assert r.status_code == 503, (method, url, r.text)
        assert "no longer acts on jobs (another control plane holds the database)" in r.json()["detail"]
    assert client.get(f"/v1/jobs/{queued}", headers=admin).json()["phase"] == "Pending"
    assert [j["id"] for j in client.get("/v1/jobs", headers=admin).json()["items"]] == [queued]


# ---------------------------------------------------------------- folders


def _folder(path: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)


def test_a_jobs_folders_and_its_replicas_go_and_no_other_jobs(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for name in ("j-1", "j-1--r0of2", "j-1--r1of2", "j-10", "j-1x", "j-1--r0of1"):
        _folder(runs / name, {"job.log": name, "attempt-1/state.json": "{}", "checkpoints/c.pt": "x"})
    assert remove_job_folders(runs, "j-1") == 3
    assert sorted(os.listdir(runs)) == ["j-1--r0of1", "j-10", "j-1x"]
    assert remove_job_folders(runs, "j-1") == 0 and remove_job_folders(tmp_path / "none", "j-1") == 0
    for bad in ("", "..", ".", "a/b"):
        with pytest.raises(ValueError):
            remove_job_folders(runs, bad)


def test_links_a_job_left_are_removed_not_followed(tmp_path: Path) -> None:
    """A job's folder may hold links to anything its uid could name (another tenant's files,
    the plane's database): removing the folder must not reach through them."""
    precious = tmp_path / "precious"
    _folder(precious, {"keep.txt": "mine", "sub/deep.txt": "mine too"})
    runs = tmp_path / "runs"
    _folder(runs / "j-1", {"job.log": "x"})
    os.symlink(precious, runs / "j-1" / "link-to-dir")
    os.symlink(precious / "keep.txt", runs / "j-1" / "link-to-file")
    os.symlink(precious, runs / "j-2")  # a link where a job's folder would be
    assert remove_job_folders(runs, "j-1") == 1 and remove_job_folders(runs, "j-2") == 1
    assert (precious / "keep.txt").read_text() == "mine" and (precious / "sub" / "deep.txt").exists()
    assert os.listdir(runs) == []


def test_a_folder_nested_deeper_than_python_recurses_is_removed_whole(tmp_path: Path) -> None:
    """A job may nest folders thousands deep (each opened from the last: no path too long).
    shutil.rmtree recurses once a level: past ~1,000 it raised RecursionError half way, the
    replicas' folders after it were never tried, and the job's record being gone, nothing
    ever removed the rest — the tenant's files outlived retention on the runs disk."""
    runs = tmp_path / "runs"
    _folder(runs / "j-1", {"job.log": "x"})
    _folder(runs / "j-10", {"job.log": "another job's"})
    fd = os.open(runs / "j-1", os.O_RDONLY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "w") as f:
            f.write("x")
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.symlink(tmp_path / "runs" / "j-10", "link", dir_fd=fd)
    os.close(fd)
    _folder(runs / "j-1--r1of2", {"job.log": "replica"})
    assert remove_job_folders(runs, "j-1") == 2
    assert sorted(os.listdir(runs)) == ["j-10"] and (runs / "j-10" / "job.log").read_text() == "another job's"


def test_a_folder_the_job_locked_is_still_removed(tmp_path: Path) -> None:
    """Without isolation the job runs as the plane's own user and may take every permission
    off a folder of its own; the plane (the owner, not root) opens it up to remove it. Run
    as an unprivileged uid here, where root would not notice the lock."""
    runs = tmp_path / "runs"
    _folder(runs / "j-1", {"locked/inner/f": "x", "job.log": "y"})
    owner = 600_913 if os.geteuid() == 0 else os.geteuid()
    for here, dirs, files in os.walk(tmp_path):
        for name in (here, *(os.path.join(here, n) for n in dirs + files)):
            os.chown(name, owner, owner)
    os.chmod(runs / "j-1" / "locked" / "inner", 0)
    os.chmod(runs / "j-1" / "locked", 0)
    pid = os.fork()
    if pid == 0:  # the child removes, as the folder's owner
        try:
            if os.geteuid() == 0:
                os.setgid(owner)
                os.setuid(owner)
            os._exit(0 if remove_job_folders(runs, "j-1") == 1 else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and not (runs / "j-1").exists()


def test_the_local_engine_removes_the_folders_in_its_runs_folder(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    engine = LocalEngine(settings)
    try:
        _folder(settings.runs_dir / "j-gone", {"job.log": "x", "checkpoints/step-1/model.pt": "w"})
        _folder(settings.runs_dir / "j-kept", {"job.log": "y"})
        assert engine.remove_run_folders("j-gone") == 1
        assert not (settings.runs_dir / "j-gone").exists() and (settings.runs_dir / "j-kept" / "job.log").exists()
    finally:
        engine.close()


def test_an_old_record_without_events_is_forgotten_too() -> None:
    store = MemoryStore()
    store.create_job(replace(job("bare"), finished_at=1.0))
    retention, _ = _retention(store)
    assert retention.run(10 * DAY_S).jobs == 1 and store.get_job("bare") is None


def test_the_ray_engine_removes_the_jobs_folders_on_every_node_and_its_checkpoints(tmp_path: Path) -> None:
    """Read through the shared root the plane reads logs from: every node's part of the runs
    folder (a moved job ran on several; a gang's replicas each have one) and the checkpoint
    root. The method needs no cluster, so it is called on a bare holder of those paths."""
    from types import SimpleNamespace

    from sluice.engine.ray import RayEngine

    runs, ckpt = tmp_path / "runs", tmp_path / "checkpoints"
    for node, name in (("n0", "j-1"), ("n1", "j-1"), ("n1", "j-1--r1of2"), ("n0", "j-2")):
        _folder(runs / "nodes" / node / name, {"job.log": name})
    _folder(ckpt / "j-1", {"checkpoints/step-3/model.pt": "w"})
    _folder(ckpt / "j-2", {"checkpoints/step-1/model.pt": "w"})
    from sluice.engine.ray_gang import GangBook

    gangs = GangBook()
    gangs.open("j-1", 1, ["n0", "n1"])
    gangs.open("j-2", 1, ["n0"])
    holder = SimpleNamespace(
        runs_root=runs,
        checkpoint_root=str(ckpt),
        _log_paths={"j-1": "x", "j-2": "y"},
        _timing={"j-1": {"started_at": 1.0}, "j-2": {"started_at": 2.0}},
        _gangs=gangs,
    )
    assert RayEngine.remove_run_folders(holder, "j-1") == 4  # type: ignore[arg-type]
    assert sorted(str(p.relative_to(runs)) for p in runs.glob("nodes/*/*")) == ["nodes/n0/j-2"]
    assert os.listdir(ckpt) == ["j-2"] and holder._log_paths == {"j-2": "y"}
    assert list(holder._timing) == ["j-2"] and list(gangs.rank0) == ["j-2"]  # nor kept in memory


def test_a_bound_of_kept_jobs_does_not_starve_the_jobs_behind_it_pass_after_pass() -> None:
    """More kept candidates (waited for; arrays with a live job) than a pass looks at: each
    pass began again at the earliest, saw only those, and no later job was ever forgotten —
    a tenant with ten 1,000-job arrays, one job of each left running, stopped retention for
    every tenant. A pass goes on from where the last one stopped."""
    store, deps, waiting = _kept_then_late(late=3)
    now = 10 * DAY_S
    retention, _ = _retention(store, [waiting], batch=2, most_per_pass=4)
    for _ in range(3):
        retention.run(now)
    assert sorted(j.id for j in store.list_jobs()) == sorted(deps)


def test_candidates_are_read_through_the_finished_index_not_every_ended_job(tmp_path: Path) -> None:
    """SQLite chose the phase index for `ended_before` (`phase IN (...)` is an equality) and
    sorted every ended job by finish time to take a batch: every batch of every pass read
    all the jobs retention keeps (90 days of them), under the controller's lock — 0.06 s at
    200,000 even with nothing due, 0.11 s a batch. It reads the finished_at index instead."""
    store = SqlStore(f"sqlite:///{tmp_path}/db.sqlite")
    try:
        seen: list[tuple[str, object]] = []

        def capture(conn: object, cursor: object, statement: str, params: object, context: object, many: bool) -> None:
            if statement.lstrip().upper().startswith("SELECT") and "finished_at" in statement:
                seen.append((statement, params))

        event.listen(store._engine, "before_cursor_execute", capture)
        store.ended_before(100.0, 10)
        store.ended_before(100.0, 10, after=(5.0, "j-x"))
        event.remove(store._engine, "before_cursor_execute", capture)
        assert len(seen) == 2
        with store._engine.connect() as conn:
            for statement, params in seen:
                plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params))  # type: ignore[arg-type]
                assert "ix_jobs_finished" in plan and "ix_jobs_phase" not in plan, plan
    finally:
        store.close()


def test_a_plane_that_is_stopping_forgets_nothing(
    plane: tuple[ControlPlane, FakeEngine, TestClient, dict[str, str]],
) -> None:
    """Its store is about to close: a pass that went on past the stop (the thread is waited
    for 10 s) met a closed store (red team s28). A pass of a stopping plane does nothing."""
    cp, engine, client, admin = plane
    body = {"name": "t", "command": ["python", "t.py"], "resources": {"cpu": {"min": 1}}}
    ended = client.post("/v1/jobs", json=body, headers=admin).json()["id"]
    assert client.post(f"/v1/jobs/{ended}/cancel", headers=admin).status_code == 200
    assert cp.retention is not None
    engine.now += 2 * DAY_S
    cp._stop.set()  # what stop() does first
    assert cp.retention.retention.run(engine.now).jobs == 0
    cp._stop.clear()
    assert cp.retention.retention.run(engine.now).jobs == 1
