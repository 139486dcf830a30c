"""Job arrays (Slurm's `--array`): one submit makes `count` jobs told apart by their index,
at most `parallel` of them admitted at once, lowest index first. Over the API and the CLI,
with the FakeEngine (no processes)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

from sluice.agent.launchenv import build_env
from sluice.model import JobExited, Phase

from . import test_queue_grants_and_limits as grants
from .test_queue_grants_and_limits import Live, problems, sluice

live = grants.live  # the fixture: a plane on the FakeEngine served over HTTP, tenants alice and bob


def submit_array(live: Live, who: str, count: int, parallel: int | None = None, **kw: object) -> dict:  # type: ignore[type-arg]
    array = {"count": count} | ({} if parallel is None else {"parallel": parallel})
    r = live.submit(who, cpu=0.5, array=array, **kw)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def walk_pages(live: Live, query: str, who: str) -> list[str]:
    """The ids of every page of a list, following its cursor."""
    seen: list[str] = []
    cursor = None
    while True:
        r = live.call("GET", query + (f"&cursor={cursor}" if cursor else ""), who)
        assert r.status_code == 200, r.text
        seen += [j["id"] for j in r.json()["items"]]
        cursor = r.json()["next_cursor"]
        if not cursor:
            return seen


def phases(live: Live, ids: list[str]) -> list[Phase]:
    return [live.job(i).phase for i in ids]


def test_an_array_makes_its_jobs_and_admits_at_most_parallel_of_them_lowest_index_first(
    live: Live, tmp_path: Path
) -> None:
    first = submit_array(live, "alice", 5, parallel=2)
    array_id = first["spec"]["array"]["id"]
    assert first["id"] == f"{array_id}-0"
    ids = [f"{array_id}-{i}" for i in range(5)]
    assert [live.job(i).spec.array.index for i in ids] == list(range(5))
    live.plane.step()
    # Quota and capacity (4 cores, 0.5 a job) would admit all five; the array lets two go.
    assert phases(live, ids[:2]) == [Phase.STARTING] * 2
    assert phases(live, ids[2:]) == [Phase.PENDING] * 3
    waiting = live.job(ids[2]).reason
    assert f"array {array_id} runs at most 2 of its jobs at once (array.parallel)" in waiting
    # What the node agent puts in the job's environment (agent/launchenv.py).
    [req] = [r for r in live.engine.launched if r.job_id == ids[1]]
    env = build_env(req, run_dir=tmp_path, node="n0", node_cpus=2, gpus=[], base={})
    assert {k: env[k] for k in env if k.startswith("SLUICE_ARRAY_")} == {
        "SLUICE_ARRAY_ID": array_id,
        "SLUICE_ARRAY_INDEX": "1",
        "SLUICE_ARRAY_COUNT": "5",
    }
    live.start(ids[0])
    live.start(ids[1])
    live.engine.pending.append(JobExited(ids[1], 1, live.engine.now, 0, retryable=False))
    live.plane.step()
    live.plane.step()
    assert live.job(ids[1]).phase == Phase.SUCCEEDED
    assert phases(live, ids[2:]) == [Phase.STARTING, Phase.PENDING, Phase.PENDING]  # the next index took the turn
    # A job of no array, or of an array without `parallel`, is not held.
    free = submit_array(live, "alice", 2)
    live.plane.step()
    assert live.job(free["id"]).phase == Phase.STARTING


def test_an_array_is_made_whole_or_not_at_all_within_the_tenants_cap(live: Live) -> None:
    live.plane.settings.max_unfinished_jobs_per_tenant = 4
    assert live.submit("alice").status_code == 201
    r = live.submit("alice", array={"count": 4})
    assert (
        r.status_code == 409
        and "has 1 jobs that have not ended, and an array of 4 more would pass" in r.json()["detail"]
    ), r.text
    assert len(live.plane.controller.book.live()) == 1  # none of the four made
    assert live.submit("alice", array={"count": 3}).status_code == 201


def test_what_sluice_sets_on_an_array_is_refused_from_a_tenant_and_bad_counts_are_422s(live: Live) -> None:
    theirs = submit_array(live, "alice", 2, parallel=1)["spec"]["array"]["id"]
    # bob cannot put a job into alice's array (its turns, its listing), nor pick its index.
    assert "array.id" in problems(live.submit("bob", array={"count": 1, "id": theirs}))
    assert "array.index" in problems(live.submit("bob", array={"count": 2, "index": 1}))
    assert "array" in problems(live.submit("bob", array={"count": 2}, resume_from="j-0123456789"))
    for bad in (0, -1, 1001, "x", 2.5, True, None):
        assert "array.count" in problems(live.submit("bob", array={"count": bad})), bad
    for bad in (0, 1001, "x"):
        assert "array.parallel" in problems(live.submit("bob", array={"count": 2, "parallel": bad})), bad
    assert "array.extra" in problems(live.submit("bob", array={"count": 2, "extra": 1}))


def test_array_on_the_cli_submit_list_and_cancel(live: Live, tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: sweep\ncommand: [python, train.py]\nresources: {cpu: {min: 0.5}}\n")
    code, out, err = sluice(live, "alice", "job", "submit", str(spec), "--array", "3%1")
    assert code == 0, err
    array_id = out.strip()
    assert f"array {array_id}: 3 jobs, {array_id}-0 to {array_id}-2, at most 1 at once" in err
    assert [live.job(f"{array_id}-{i}").spec.array.parallel for i in range(3)] == [1, 1, 1]
    code, out, _ = sluice(live, "alice", "job", "list", "--array", array_id, "-o", "json")
    assert code == 0 and out.count(f'"{array_id}-') == 3
    code, out, _ = sluice(live, "alice", "job", "list", "--array", array_id)
    assert code == 0 and "sweep[0]" in out and "sweep[2]" in out, out
    code, out, _ = sluice(live, "alice", "job", "get", f"{array_id}-2")
    assert code == 0 and f"2 of 3 in {array_id}, at most 1 at once" in out, out
    # bob sees none of it and cancels none of it.
    code, out, err = sluice(live, "bob", "job", "list", "--array", array_id)
    assert code != 0 and f"job array {array_id} not found" in err and array_id not in out
    code, out, err = sluice(live, "alice", "job", "list", "--array", array_id, "--phase", "running")
    assert code == 0 and "no jobs of that phase and array" in err
    code, _, err = sluice(live, "bob", "job", "cancel", "--array", array_id)
    assert code != 0 and f"job array {array_id} not found" in err
    assert phases(live, [f"{array_id}-{i}" for i in range(3)]) == [Phase.PENDING] * 3
    code, out, err = sluice(live, "alice", "job", "cancel", "--array", array_id, "-o", "json")
    assert code == 0, err
    assert out.count(f'"{array_id}-') == 3  # one request, every job of it, as a list
    assert phases(live, [f"{array_id}-{i}" for i in range(3)]) == [Phase.CANCELLED] * 3
    code, _, err = sluice(live, "alice", "job", "cancel", "--array", array_id)
    assert code != 0 and "none of your jobs of it is still to end" in err
    for bad in ("", "3%", "%2", "-3", "3%1%1", "x"):
        code, _, err = sluice(live, "alice", "job", "submit", str(spec), "--array", bad)
        assert code == 2 and "--array" in err, (bad, err)
    code, _, err = sluice(live, "alice", "job", "submit", str(spec), "--array", "5000")
    assert code == 2 and "array.count" in err, err
    # A number too large is refused as too large, naming its field, not as "not N or N%K".
    for big, field in (("1000000000", "array.count"), ("9" * 5000, "array.count"), ("2%10000000", "array.parallel")):
        code, _, err = sluice(live, "alice", "job", "submit", str(spec), "--array", big)
        assert code == 2 and field in err and "less than or equal to 1000" in err and "not N" not in err, (big, err)


def test_after_an_array_waits_for_every_job_of_it_and_is_cancelled_if_one_fails(live: Live) -> None:
    """Slurm's afterok on an array job id: a job after an array starts once each of its jobs has
    Succeeded; one that ends otherwise cancels it. Another tenant's array reads as none."""
    array_id = submit_array(live, "alice", 3)["spec"]["array"]["id"]
    ids = [f"{array_id}-{i}" for i in range(3)]
    r = live.submit("alice", cpu=0.5, after=[array_id])
    assert r.status_code == 201, r.text
    gather = r.json()["id"]
    assert "after.0" in problems(live.submit("bob", after=[array_id]))  # alice's array is not bob's
    live.plane.step()
    for job_id in ids:
        live.start(job_id)
    assert live.job(gather).phase == Phase.PENDING
    assert (
        live.job(gather).reason
        == f"waiting for {ids[0]} (Running), {ids[1]} (Running), {ids[2]} (Running) to succeed (after)"
    )
    for job_id in ids[:2]:
        live.engine.pending.append(JobExited(job_id, 1, live.engine.now, 0, retryable=False))
    live.plane.step()
    live.plane.step()
    assert (
        live.job(gather).phase == Phase.PENDING
        and live.job(gather).reason == f"waiting for {ids[2]} (Running) to succeed (after)"
    )
    live.engine.pending.append(JobExited(ids[2], 1, live.engine.now, 0, retryable=False))
    live.plane.step()
    live.plane.step()
    assert live.job(gather).phase in (Phase.QUEUED, Phase.STARTING)

    # One job of the array failing cancels what waits for the array; a new one is a 409.
    other = submit_array(live, "alice", 2)["spec"]["array"]["id"]
    after_other = live.submit("alice", cpu=0.5, after=[other]).json()["id"]
    live.plane.step()
    live.start(f"{other}-0")
    live.engine.pending.append(JobExited(f"{other}-0", 1, live.engine.now, 3, retryable=False))
    live.plane.step()
    live.plane.step()
    assert live.job(f"{other}-0").phase == Phase.FAILED
    assert live.job(after_other).phase == Phase.CANCELLED
    assert f"job {other}-0, which it starts after, ended Failed" in live.job(after_other).reason
    r = live.submit("alice", after=[other])
    assert r.status_code == 409 and f"after: job {other}-0 ended Failed" in r.text


def test_after_any_an_array_gathers_once_every_job_of_it_ended_some_failed(live: Live) -> None:
    """Sweep, then gather whatever happened (Slurm's afterany on an array): a failed run of the
    sweep does not cancel the gather, and an array that already ended, failures and all, is no
    409. Another tenant's array reads as none, under its own field."""
    sweep = submit_array(live, "alice", 2)["spec"]["array"]["id"]
    r = live.submit("alice", cpu=0.5, after_any=[sweep])
    assert r.status_code == 201, r.text
    gather = r.json()["id"]
    assert "after_any.0" in problems(live.submit("bob", after_any=[sweep]))
    live.plane.step()
    live.start(f"{sweep}-0")
    live.start(f"{sweep}-1")
    live.engine.pending.append(JobExited(f"{sweep}-0", 1, live.engine.now, 3, retryable=False))
    live.plane.step()
    live.plane.step()
    assert live.job(f"{sweep}-0").phase == Phase.FAILED and live.job(gather).phase == Phase.PENDING
    assert live.job(gather).reason == f"waiting for {sweep}-1 (Running) to end (after_any)"
    live.engine.pending.append(JobExited(f"{sweep}-1", 1, live.engine.now, 0, retryable=False))
    live.plane.step()
    live.plane.step()
    assert live.job(gather).phase in (Phase.QUEUED, Phase.STARTING)
    r = live.submit("alice", cpu=0.5, after_any=[sweep])  # ended, one failed: still fine to gather
    assert r.status_code == 201, r.text
    assert live.submit("alice", cpu=0.5, after=[sweep]).status_code == 409  # `after` could never start


def test_an_array_is_cancelled_in_one_request_only_by_its_tenant_or_an_admin(live: Live) -> None:
    """`POST /v1/jobs/cancel {"array": ID}`: every job of the array not yet ended, in one
    request. Another tenant's array is a 404 like its jobs (and nothing is cancelled); an
    admin may cancel any; a body that is not exactly `{"array": "<id>"}` is a 422."""
    array_id = submit_array(live, "alice", 4)["spec"]["array"]["id"]
    ids = [f"{array_id}-{i}" for i in range(4)]
    live.call("POST", f"/v1/jobs/{ids[0]}/cancel", "alice")  # one ended already
    for bad in ({}, {"array": ""}, {"array": "x" * 65}, {"array": 7}, {"array": array_id, "ids": ids}, [array_id]):
        r = live.call("POST", "/v1/jobs/cancel", "alice", bad)
        assert r.status_code == 422, (bad, r.text)
    for who, what in (("bob", array_id), ("alice", "j-nothing"), ("alice", ids[1])):
        r = live.call("POST", "/v1/jobs/cancel", who, {"array": what})
        assert r.status_code == 404 and "not found" in r.text, (who, what, r.text)
    assert phases(live, ids[1:]) == [Phase.PENDING] * 3
    r = live.call("POST", "/v1/jobs/cancel", "admin", {"array": array_id})
    assert r.status_code == 200, r.text
    assert [j["id"] for j in r.json()] == ids[1:]  # the ones not ended, lowest index first
    assert phases(live, ids) == [Phase.CANCELLED] * 4
    r = live.call("POST", "/v1/jobs/cancel", "alice", {"array": array_id})
    assert r.status_code == 200 and r.json() == []  # all ended: nothing left to cancel


def test_the_jobs_of_an_array_are_listed_by_the_server_a_page_at_a_time(live: Live) -> None:
    """`GET /v1/jobs?array=ID` reads the array's jobs by id (never the tenant's whole list):
    every job once across pages, in the list's own order, with the phase filter; another
    tenant's array, or one never made, is a 404; an admin sees any."""
    other = submit_array(live, "alice", 3)  # another array of alice's: never listed with it
    first = submit_array(live, "alice", 12)
    array_id = first["spec"]["array"]["id"]
    live.call("POST", f"/v1/jobs/{array_id}-4/cancel", "alice")
    walked = live.plane.list_jobs
    live.plane.list_jobs = None  # type: ignore[assignment,method-assign]  # the array path must not walk the list
    try:
        seen = walk_pages(live, f"/v1/jobs?array={array_id}&limit=5", "alice")
        assert seen == sorted(f"{array_id}-{k}" for k in range(12))  # one submit time: by id
        r = live.call("GET", f"/v1/jobs?array={array_id}&phase=cancelled", "alice")
        assert [j["id"] for j in r.json()["items"]] == [f"{array_id}-4"]
        assert len(live.call("GET", f"/v1/jobs?array={array_id}", "admin").json()["items"]) == 12
        for who, arr in (("bob", array_id), ("alice", "j-nosuchthing"), ("alice", other["id"])):  # a job's id
            r = live.call("GET", f"/v1/jobs?array={arr}", who)
            assert r.status_code == 404 and "not found" in r.text, (who, arr, r.text)
        for bad in ("", "x" * 65):
            r = live.call("GET", f"/v1/jobs?array={bad}", "alice")
            assert r.status_code == 422 and "array" in r.text, bad
    finally:
        live.plane.list_jobs = walked  # type: ignore[method-assign]


def test_a_phase_filter_on_an_array_reads_only_the_jobs_it_lists(live: Live) -> None:
    """`GET /v1/jobs?array=ID&phase=...` read every ended job of the array whole (a record
    with its spec) to find its phase, under the controller's lock: a tenant's 1,000-job array
    of 1 MiB specs cost 1 GB of reads a request, whatever the page. Phases are read first;
    only the jobs listed are read whole."""
    first = submit_array(live, "alice", 40)
    array_id = first["spec"]["array"]["id"]
    ids = sorted(f"{array_id}-{k}" for k in range(40))
    assert live.call("POST", "/v1/jobs/cancel", "alice", {"array": array_id}).status_code == 200
    store = live.plane.store
    reads: list[str] = []
    get = store.get_job

    def counted(job_id: str) -> object:
        reads.append(job_id)
        return get(job_id)

    store.get_job = counted  # type: ignore[assignment,method-assign]
    try:
        r = live.call("GET", f"/v1/jobs?array={array_id}&phase=running", "alice")
        assert r.status_code == 200 and r.json()["items"] == [], r.text
        assert len(reads) <= 2, reads  # the array's first job (who owns it, how many), no more
        reads.clear()
        seen = walk_pages(live, f"/v1/jobs?array={array_id}&phase=cancelled&limit=15", "alice")
        assert seen == ids
        assert len(reads) <= 40 + 3 * 3, len(reads)
    finally:
        store.get_job = get  # type: ignore[method-assign]


def test_an_array_id_that_no_job_id_could_be_is_refused_before_any_read(live: Live) -> None:
    """`?array=` and the cancel body took any 1-64 characters and read `<it>-0` from the
    store: on PostgreSQL an id with a NUL (`%00`) is a ValueError from the driver, a 500;
    any other shape was a read for nothing. Array ids are job ids (JOB_ID_PATTERN), as
    `after` and `resume_from` are checked."""
    for bad in ("j-1\x00", "../j-1", "j-1/x", "é", "j 1", "%", "-j"):
        r = live.call("GET", "/v1/jobs?" + urlencode({"array": bad}), "alice")
        assert r.status_code == 422 and "array" in r.text, (bad, r.status_code, r.text)
        r = live.call("POST", "/v1/jobs/cancel", "alice", {"array": bad})
        assert r.status_code == 422 and "array" in r.text, (bad, r.status_code, r.text)
