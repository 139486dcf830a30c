"""Deleting ended jobs now (`sluice job delete`, `DELETE /v1/jobs/{id}`, `POST /v1/jobs/delete`):
what retention does after `job_retention_days`, on a user's word. Attacked as a tenant would:
another tenant's jobs, live jobs, one job of an array, jobs a live job starts after, ids no
job can have. Over HTTP and the CLI, with the FakeEngine (no processes; the local engine's
folders are removed in tests/integration/test_queues_local.py)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.control.errors import Unavailable
from sluice.model import JobExited, Phase

from . import test_queue_grants_and_limits as grants
from .test_job_arrays import submit_array
from .test_queue_grants_and_limits import Live, sluice

live = grants.live  # the fixture: a plane on the FakeEngine served over HTTP, tenants alice and bob


def folders_removed(live: Live) -> list[str]:
    """Make the FakeEngine one that keeps run folders (`RunFolders`): the ids it was asked to
    remove, in order."""
    removed: list[str] = []

    def remove(job_id: str) -> int:
        removed.append(job_id)
        return 1

    live.engine.remove_run_folders = remove  # type: ignore[attr-defined]
    live.engine.run_folder = lambda job_id, rank=0: None  # type: ignore[attr-defined]
    live.engine.still_running = lambda ids: sorted(set(ids) & lingering)  # type: ignore[attr-defined]
    return removed


lingering: set[str] = set()
"""The jobs the FakeEngine (once it keeps folders) says still have processes on their node."""


def succeed(live: Live, job_id: str) -> None:
    live.plane.step()
    live.start(job_id)
    job = live.job(job_id)
    live.engine.pending.append(JobExited(job_id, job.attempt, live.engine.now, 0, retryable=False))
    live.plane.step()
    assert live.job(job_id).phase == Phase.SUCCEEDED


def ended(live: Live, who: str) -> str:
    job_id: str = live.submit(who).json()["id"]
    assert live.call("POST", f"/v1/jobs/{job_id}/cancel", who).status_code == 200
    return job_id


def events(live: Live, kind: str) -> list[Any]:
    return live.plane.store.events(kinds=[kind])


def test_an_ended_job_is_forgotten_with_its_events_and_folders_and_said_so(live: Live) -> None:
    removed = folders_removed(live)
    done = live.submit("alice").json()["id"]
    succeed(live, done)
    assert live.plane.store.events(job_id=done)
    r = live.call("DELETE", f"/v1/jobs/{done}", "alice")
    assert r.status_code == 200, r.text
    assert r.json() == {"deleted": [done], "folders": 1}
    assert removed == [done]
    assert live.call("GET", f"/v1/jobs/{done}", "alice").status_code == 404
    assert live.call("GET", f"/v1/jobs/{done}/why", "alice").status_code == 404
    assert live.plane.store.events(job_id=done) == []
    assert [j["id"] for j in live.call("GET", "/v1/jobs", "alice").json()["items"]] == []
    # the plane keeps a note of who deleted what (an event of no job, read by no tenant)
    (note,) = events(live, "deleted")
    assert note.job_id is None and note.message == f"job {done} of tenant alice deleted by alice"
    # deleted twice: the second finds nothing, as for a job that never was
    assert live.call("DELETE", f"/v1/jobs/{done}", "alice").status_code == 404
    # a job started after it is refused as after a job never made
    r = live.submit("alice", after=[done])
    assert r.status_code == 422 and "after.0" in r.text


def test_another_tenants_job_reads_as_none_and_stays_and_an_admin_may_delete_it(live: Live) -> None:
    removed = folders_removed(live)
    bobs = ended(live, "bob")
    r = live.call("DELETE", f"/v1/jobs/{bobs}", "alice")
    assert r.status_code == 404 and r.json()["detail"] == f"job {bobs} not found"
    assert live.job(bobs) is not None and removed == []
    assert live.call("DELETE", f"/v1/jobs/{bobs}", "admin").status_code == 200
    assert live.job(bobs) is None and removed == [bobs]
    (note,) = events(live, "deleted")
    assert note.message == f"job {bobs} of tenant bob deleted by admin"


def test_a_job_that_has_not_ended_is_refused_and_kept(live: Live) -> None:
    removed = folders_removed(live)
    queued = live.submit("alice").json()["id"]
    running = live.submit("alice").json()["id"]
    live.plane.step()
    live.start(running)
    suspended = live.submit("alice").json()["id"]
    assert live.call("POST", f"/v1/jobs/{suspended}/suspend", "alice").status_code == 200
    for job_id in (queued, running, suspended):
        phase = live.job(job_id).phase
        r = live.call("DELETE", f"/v1/jobs/{job_id}", "alice")
        assert r.status_code == 409, r.text
        assert r.json()["detail"].startswith(f"job {job_id} is {phase}: only an ended job can be deleted")
        assert f"sluice job cancel {job_id}" in r.json()["detail"]
        assert live.job(job_id).phase == phase
    assert removed == [] and events(live, "deleted") == []


def test_a_job_a_live_job_starts_after_is_kept_until_that_one_ends(live: Live) -> None:
    first = live.submit("alice").json()["id"]
    succeed(live, first)
    waiting = live.submit("alice", after=[first]).json()["id"]  # not stepped: Pending
    r = live.call("DELETE", f"/v1/jobs/{first}", "alice")
    assert r.status_code == 409
    assert r.json()["detail"].startswith(f"job {waiting} starts after job {first}, which cannot be deleted")
    assert live.job(first) is not None
    assert live.call("POST", f"/v1/jobs/{waiting}/cancel", "alice").status_code == 200
    any_way = live.submit("alice", after_any=[first]).json()["id"]  # waits for it as much
    r = live.call("DELETE", f"/v1/jobs/{first}", "alice")
    assert r.status_code == 409 and r.json()["detail"].startswith(f"job {any_way} starts after job {first}")
    assert live.call("POST", f"/v1/jobs/{any_way}/cancel", "alice").status_code == 200
    assert live.call("DELETE", f"/v1/jobs/{first}", "alice").status_code == 200


def test_an_array_goes_whole_once_all_of_it_ended_never_a_job_of_it_alone(live: Live) -> None:
    removed = folders_removed(live)
    first = submit_array(live, "alice", 3)
    array_id = first["spec"]["array"]["id"]
    ids = [f"{array_id}-{k}" for k in range(3)]
    assert live.call("POST", f"/v1/jobs/{ids[2]}/cancel", "alice").status_code == 200
    r = live.call("DELETE", f"/v1/jobs/{ids[2]}", "alice")
    assert r.status_code == 409 and f"sluice job delete --array {array_id}" in r.json()["detail"]
    r = live.call("POST", "/v1/jobs/delete", "alice", {"array": array_id})
    assert r.status_code == 409 and "(and 1 more of the array)" in r.json()["detail"]
    assert f"sluice job cancel --array {array_id}" in r.json()["detail"]
    assert all(live.job(i) is not None for i in ids) and removed == []
    succeed(live, ids[0])
    succeed(live, ids[1])
    # another tenant's array reads as none; a job waiting for one of it keeps it whole
    assert live.call("POST", "/v1/jobs/delete", "bob", {"array": array_id}).status_code == 404
    waiting = live.submit("alice", after=[ids[1]]).json()["id"]  # not stepped: Pending
    r = live.call("POST", "/v1/jobs/delete", "alice", {"array": array_id})
    assert r.status_code == 409 and f"job {waiting} starts after job array {array_id}" in r.json()["detail"]
    assert live.call("POST", f"/v1/jobs/{waiting}/cancel", "alice").status_code == 200
    r = live.call("POST", "/v1/jobs/delete", "alice", {"array": array_id})
    assert r.status_code == 200 and r.json() == {"deleted": ids, "folders": 3}
    assert removed == ids and all(live.job(i) is None for i in ids)
    assert live.call("GET", f"/v1/jobs?array={array_id}", "alice").status_code == 404
    (note,) = events(live, "deleted")
    assert note.message == f"job array {array_id} of tenant alice deleted by alice"


def test_ids_no_job_can_have_are_none_and_bad_bodies_are_422s(live: Live) -> None:
    for bad in ("a%00b", "..", "j-x%2F..%2F..", "x" * 300):
        assert live.call("DELETE", f"/v1/jobs/{bad}", "alice").status_code == 404, bad
    for body in ({"array": "a\x00b"}, {"array": ""}, {}, {"array": "j-1", "more": 1}):
        assert live.call("POST", "/v1/jobs/delete", "alice", body).status_code == 422, body


def test_the_cli_deletes_each_id_reports_each_failure_and_exits_with_the_first(live: Live) -> None:
    removed = folders_removed(live)
    a, b = ended(live, "alice"), ended(live, "alice")
    running = live.submit("alice").json()["id"]
    code, out, err = sluice(live, "alice", "job", "delete", a, "j-nosuch", running, b, a)
    assert code == 1, (out, err)
    assert f"{a}: deleted" in out and f"{b}: deleted" in out and "run folders removed: 2" in out
    assert "j-nosuch" in err and f"job {running} is Pending" in err
    assert removed == [a, b] and live.job(running) is not None
    code, out, err = sluice(live, "alice", "job", "delete")
    assert code == 2 and "JOB_IDS" in err
    first = submit_array(live, "alice", 2)
    array_id = first["spec"]["array"]["id"]
    assert live.call("POST", "/v1/jobs/cancel", "alice", {"array": array_id}).status_code == 200
    code, out, err = sluice(live, "alice", "job", "delete", "--array", array_id, "-o", "json")
    assert code == 0, err
    assert f'"deleted": [\n      "{array_id}-0",' in out or f'"{array_id}-1"' in out


def test_a_plane_that_lost_its_database_to_another_deletes_nothing(live: Live) -> None:
    """Once another plane took the database (`lost_database`), this plane's book is stale: a
    job live under the other plane is not in it, read from the store it looked deletable, and
    its record, events and folders went while that plane ran it (a job waiting for one is not
    in it either). Retention stops there (`halted`); a delete is refused too, a 503."""
    removed = folders_removed(live)
    done = ended(live, "alice")
    theirs = replace(live.job(done), id="j-0ther0plane", phase=Phase.RUNNING, finished_at=None)
    live.plane.store.create_job(theirs)  # made and running under the other plane
    live.plane.lost_database = "another control plane (pid 1) uses the database"
    for job_id in (theirs.id, done):
        r = live.call("DELETE", f"/v1/jobs/{job_id}", "alice")
        assert r.status_code == 503, r.text
        assert "this plane no longer acts on jobs" in r.json()["detail"]  # the API refuses every change
        assert live.plane.store.get_job(job_id) is not None
    assert removed == [] and events(live, "deleted") == []
    # and the plane itself refuses too
    with pytest.raises(Unavailable, match="another plane took this plane's database or Ray namespace"):
        live.plane.delete_job(live.plane.store.get_tenant("alice"), done)  # type: ignore[arg-type]
    assert live.plane.store.get_job(done) is not None and removed == []


def test_deletes_under_way_at_once_are_bounded_a_tenant_and_a_plane(live: Live) -> None:
    """A delete removes its run folders inside the request (a folder of a million files takes
    seconds): unbounded, one tenant's parallel deletes held every API worker thread. As resume
    copies are, they are bounded (job_deletes_per_tenant, 2 here): one more is a 429 that
    deleted nothing."""
    release = threading.Event()
    removing: list[str] = []

    def remove(job_id: str) -> int:
        if job_id in jobs:  # alice's: big folders
            removing.append(job_id)
            release.wait(30)
        return 1

    live.engine.remove_run_folders = remove  # type: ignore[attr-defined]
    live.engine.run_folder = lambda job_id, rank=0: None  # type: ignore[attr-defined]
    live.engine.still_running = lambda ids: []  # type: ignore[attr-defined]
    jobs = [ended(live, "alice") for _ in range(3)]
    with ThreadPoolExecutor(2) as pool:
        headers = {"Authorization": f"Bearer {live.tokens['alice']}"}
        slow = [pool.submit(httpx.delete, f"{live.url}/v1/jobs/{j}", headers=headers, timeout=60) for j in jobs[:2]]
        deadline = time.monotonic() + 10
        while len(removing) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(removing) == 2
        r = live.call("DELETE", f"/v1/jobs/{jobs[2]}", "alice")
        assert r.status_code == 429, r.text
        assert "job_deletes_per_tenant" in r.json()["detail"]
        assert live.job(jobs[2]) is not None  # nothing of it deleted
        bobs = ended(live, "bob")
        assert live.call("DELETE", f"/v1/jobs/{bobs}", "bob").status_code == 200, "another tenant's go on"
        release.set()
        assert [f.result().status_code for f in slow] == [200, 200]
    assert live.call("DELETE", f"/v1/jobs/{jobs[2]}", "alice").status_code == 200


def test_a_job_whose_processes_linger_after_it_ended_is_kept_until_they_are_gone(live: Live) -> None:
    """sluice ends a job itself before its processes are gone (an internal error, a lost node):
    its folder is not removed from under them. Refused (409, nothing deleted) while the node says
    any of its processes runs, an array's too; deleted once they are gone."""
    removed = folders_removed(live)
    job_id = ended(live, "alice")
    array_id = submit_array(live, "alice", 2)["spec"]["array"]["id"]
    for k in range(2):
        assert live.call("POST", f"/v1/jobs/{array_id}-{k}/cancel", "alice").status_code == 200
    lingering.update({job_id, f"{array_id}-1"})
    try:
        r = live.call("DELETE", f"/v1/jobs/{job_id}", "alice")
        assert r.status_code == 409 and "its processes on its node have not exited yet" in r.json()["detail"]
        r = live.call("POST", "/v1/jobs/delete", "alice", {"array": array_id})
        assert r.status_code == 409 and f"job {array_id}-1 is Cancelled, but its processes" in r.json()["detail"]
        assert removed == [] and live.call("GET", f"/v1/jobs/{job_id}", "alice").status_code == 200
        assert live.call("GET", f"/v1/jobs/{array_id}-0", "alice").status_code == 200
    finally:
        lingering.clear()
    assert live.call("DELETE", f"/v1/jobs/{job_id}", "alice").status_code == 200
    assert live.call("POST", "/v1/jobs/delete", "alice", {"array": array_id}).status_code == 200
    assert removed == [job_id, f"{array_id}-0", f"{array_id}-1"]


def test_a_log_followed_while_its_job_ends_and_is_deleted_ends_saying_so(live: Live, tmp_path: Path) -> None:
    """Deleted in the half second between its end and the follower's next look, a followed log
    broke off with the NotFound (a chunked response cut short, an error in the client); now it
    ends with a line saying the job was deleted."""
    job_id = live.submit("alice").json()["id"]
    live.plane.step()
    live.start(job_id)
    log = tmp_path / f"{job_id}.log"
    log.write_text("epoch 1\n")
    live.engine.log_path = lambda job_id: str(log)  # type: ignore[method-assign]
    caller = live.plane.store.get_tenant("alice")
    assert caller is not None

    def end_and_delete() -> None:
        with live.plane.controller.lock:  # the follower cannot look in between
            live.engine.pending.append(JobExited(job_id, live.job(job_id).attempt, live.engine.now, 0))
            live.plane.step()
            live.plane.delete_job(caller, job_id)

    received: list[str] = []
    headers = {"Authorization": f"Bearer {live.tokens['alice']}"}
    with httpx.stream("GET", f"{live.url}/v1/jobs/{job_id}/logs?follow=true", headers=headers, timeout=30) as r:
        assert r.status_code == 200
        ender = None
        for chunk in r.iter_text():
            received.append(chunk)
            if ender is None:
                ender = threading.Thread(target=end_and_delete)
                ender.start()
    assert ender is not None
    ender.join()
    # what the job wrote after the follower's last look went with its folder, as a real one does
    assert "".join(received) == f"epoch 1\n[sluice] job {job_id} was deleted while followed\n"
