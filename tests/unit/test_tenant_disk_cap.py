"""A tenant's disk cap (`max_disk_mb`): what its jobs' run folders hold — live jobs' newest disk
check and ended jobs' last, since a folder outlives its job until deleted — at or past the cap
holds its pending jobs (running ones run on) until it deletes some. Another tenant is never
held for it. Over HTTP and the CLI, with the FakeEngine (no processes)."""

from __future__ import annotations

from sluice.model import JobExited, JobUsage, Phase

from . import test_queue_grants_and_limits as grants
from .test_queue_grants_and_limits import Live, problems, sluice

live = grants.live  # the fixture: a plane on the FakeEngine served over HTTP, tenants alice and bob
ADMITTED = (Phase.QUEUED, Phase.STARTING)


def run_and_end(live: Live, who: str, disk_mb: float) -> str:
    """A job of `who` that ran, was measured holding `disk_mb` and succeeded."""
    job_id: str = live.submit(who, cpu=0.5).json()["id"]
    live.plane.step()
    live.start(job_id)
    attempt = live.job(job_id).attempt
    live.engine.pending.append(JobUsage(job_id, attempt, live.engine.now, 0.5, cpu_s=1.0, disk_mb=disk_mb))
    live.engine.pending.append(JobExited(job_id, attempt, live.engine.now, 0, retryable=False))
    live.plane.step()
    assert live.job(job_id).phase == Phase.SUCCEEDED and live.job(job_id).disk_mb == disk_mb
    return job_id


def test_ended_jobs_folders_hold_the_tenants_pending_jobs_until_it_deletes_them(live: Live) -> None:
    code, out, err = sluice(live, "admin", "tenant", "set", "alice", "--max-disk-mb", "100")
    assert code == 0 and "max disk 100 MiB" in out, err
    old = [run_and_end(live, "alice", 60.0), run_and_end(live, "alice", 45.0)]  # 105 MiB left behind
    bobs_old = run_and_end(live, "bob", 500.0)  # bob has no cap, and his disk is not alice's
    waiting = live.submit("alice", cpu=0.5).json()["id"]
    bobs = live.submit("bob", cpu=0.5).json()["id"]
    live.plane.step()
    assert live.job(bobs).phase in ADMITTED
    held = live.job(waiting)
    assert held.phase == Phase.PENDING
    assert held.reason.startswith("waiting for disk: tenant alice's jobs hold its max_disk_mb of 100 MiB or more")
    assert "sluice job delete" in held.reason
    # `sluice usage` shows what the folders hold now, the tenant's own only
    (mine,) = live.call("GET", "/v1/usage?since=1e12", "alice").json()  # no job in the window: disk still
    assert mine["tenant"] == "alice" and mine["disk_mb"] == 105.0 and mine["jobs"] == 0
    assert live.call("GET", "/v1/usage?tenant=bob", "alice").status_code == 403
    every = {u["tenant"]: u["disk_mb"] for u in live.call("GET", "/v1/usage", "admin").json()}
    assert every == {"alice": 105.0, "bob": 500.0}
    code, out, err = sluice(live, "alice", "usage")
    assert code == 0 and "DISK NOW" in out and "105.0" in out, (out, err)
    # deleting one ended job frees its share at the next round
    assert live.call("DELETE", f"/v1/jobs/{old[0]}", "alice").status_code == 200
    live.plane.step()
    assert live.job(waiting).phase in ADMITTED
    assert live.job(bobs_old) is not None


def test_a_running_jobs_disk_counts_and_the_cap_can_be_lifted(live: Live) -> None:
    assert live.call("PATCH", "/v1/tenants/alice", "admin", {"max_disk_mb": 10}).json()["max_disk_mb"] == 10
    big = live.submit("alice", cpu=0.5).json()["id"]
    live.plane.step()
    live.start(big)
    live.engine.pending.append(JobUsage(big, live.job(big).attempt, live.engine.now, 0.5, cpu_s=1.0, disk_mb=11.0))
    later = live.submit("alice", cpu=0.5).json()["id"]
    live.plane.step()
    assert live.job(later).phase == Phase.PENDING and live.job(later).reason.startswith("waiting for disk")
    assert live.job(big).phase == Phase.RUNNING  # running jobs run on
    t = live.call("PATCH", "/v1/tenants/alice", "admin", {"max_disk_mb": 0}).json()  # 0: no cap
    assert t["max_disk_mb"] is None
    live.plane.step()
    assert live.job(later).phase in ADMITTED


def test_a_bad_cap_is_refused_naming_the_field_and_only_an_admin_sets_one(live: Live) -> None:
    for bad in (-1, 1024**3 + 1, "lots", 1.5):
        assert "max_disk_mb" in problems(live.call("PATCH", "/v1/tenants/alice", "admin", {"max_disk_mb": bad}))
        body = {"name": "carol", "max_disk_mb": bad}
        assert "max_disk_mb" in problems(live.call("POST", "/v1/tenants", "admin", body))
    assert live.call("PATCH", "/v1/tenants/alice", "alice", {"max_disk_mb": 1}).status_code == 403
    r = live.call("POST", "/v1/tenants", "admin", {"name": "carol", "max_disk_mb": 2048})
    assert r.status_code == 201 and r.json()["max_disk_mb"] == 2048
    code, out, _ = sluice(live, "admin", "tenant", "list")
    assert code == 0 and "MAX DISK MIB" in out and "2048" in out


def test_a_held_tenants_ended_disk_is_not_read_again_each_time_a_job_ends(live: Live, monkeypatch) -> None:
    """While a capped tenant waits, its ended jobs' sum is kept up as jobs end, not read again
    from the jobs table at every round in which any tenant's job ended (red team s29: one
    held tenant with 100,000 ended jobs cost each round a 70 ms grouped read on SQLite, 2,000
    held tenants 450 ms of a 500 ms round); what ends is still counted."""
    assert live.call("PATCH", "/v1/tenants/alice", "admin", {"max_disk_mb": 100}).status_code == 200
    running = live.submit("alice", cpu=0.5).json()["id"]
    live.plane.step()
    live.start(running)
    attempt = live.job(running).attempt
    live.engine.pending.append(JobUsage(running, attempt, live.engine.now, 0.5, cpu_s=1.0, disk_mb=30.0))
    old = run_and_end(live, "alice", 80.0)  # 30 live + 80 ended: past 100
    waiting = live.submit("alice", cpu=0.5).json()["id"]
    live.plane.step()
    assert live.job(waiting).reason.startswith("waiting for disk")
    store = live.plane.controller.store
    reads: list[set[str]] = []
    real = store.ended_disk_mb
    monkeypatch.setattr(store, "ended_disk_mb", lambda tenants: reads.append(set(tenants)) or real(tenants))
    for _ in range(3):
        run_and_end(live, "bob", 1.0)  # jobs ending, rounds passing
    live.engine.pending.append(JobExited(running, attempt, live.engine.now, 0, retryable=False))
    live.plane.step()  # alice's own: its 30 MiB move from the live sum to the ended one
    live.plane.step()
    assert live.job(running).phase == Phase.SUCCEEDED
    assert live.job(waiting).phase == Phase.PENDING and live.job(waiting).reason.startswith("waiting for disk")
    assert reads == []
    assert live.call("DELETE", f"/v1/jobs/{old}", "alice").status_code == 200  # 30 left: under
    live.plane.step()
    assert live.job(waiting).phase in ADMITTED
    assert reads == [{"alice"}]


def test_a_capped_tenants_queued_jobs_go_back_to_wait_once_it_reaches_its_cap(live: Live) -> None:
    """Admission lets every pending job of a tenant under its cap through at once, and a job
    admitted but not yet placed (Queued, waiting for a node) started whenever a node freed up,
    however far past its cap the tenant's jobs had gone meanwhile (red team s29: five jobs
    admitted at 0 MiB of a 10 MiB cap all ran, the three that waited for a node too). Now
    such a job is sent back to wait like a pending one; running jobs run on."""
    assert live.call("PATCH", "/v1/tenants/alice", "admin", {"max_disk_mb": 10}).status_code == 200
    jobs = [live.submit("alice", cpu=2).json()["id"] for _ in range(5)]  # 2 fit the two 2-CPU nodes
    live.plane.step()
    assert [live.job(j).phase for j in jobs].count(Phase.QUEUED) == 3
    placed = [j for j in jobs if live.job(j).phase == Phase.STARTING]
    for j in placed:
        live.start(j)
    first = placed[0]
    live.engine.pending.append(JobUsage(first, live.job(first).attempt, live.engine.now, 0.5, cpu_s=1.0, disk_mb=20.0))
    live.plane.step()
    waiting = [j for j in jobs if j not in placed]
    for j in waiting:
        assert live.job(j).phase == Phase.PENDING, live.job(j)
        assert live.job(j).reason.startswith("waiting for disk: tenant alice's jobs hold its max_disk_mb of 10 MiB")
    assert all(live.job(j).phase == Phase.RUNNING for j in placed)  # running jobs run on
    live.engine.pending.append(JobExited(placed[1], live.job(placed[1]).attempt, live.engine.now, 0, retryable=False))
    live.plane.step()  # a node frees up: none of alice's waiting jobs takes it
    assert all(live.job(j).phase == Phase.PENDING for j in waiting)
    crashed = placed[0]  # one that ran restarts into its folder, counted already
    live.engine.pending.append(JobExited(crashed, live.job(crashed).attempt, live.engine.now, 1, retryable=True))
    live.plane.step()
    assert live.job(crashed).phase in ADMITTED, live.job(crashed).reason


def test_a_suspended_jobs_folder_counts_and_a_null_patch_keeps_the_cap(live: Live) -> None:
    """Held (red team s29): a suspended job's folder counts as a live one's; a pending job
    cancelled before it ran counts nothing; PATCH with max_disk_mb null is a 422 naming the field
    that keeps the cap (0 removes it; null had been a 200 that changed nothing); bob, uncapped,
    is never held for alice's disk."""
    assert live.call("PATCH", "/v1/tenants/alice", "admin", {"max_disk_mb": 10}).status_code == 200
    null = live.call("PATCH", "/v1/tenants/alice", "admin", {"max_disk_mb": None})
    assert null.status_code == 422 and null.json()["problems"][0]["field"] == "max_disk_mb", null.text
    assert "0 removes the cap" in null.json()["problems"][0]["problem"]
    alice = next(t for t in live.call("GET", "/v1/tenants", "admin").json()["items"] if t["name"] == "alice")
    assert alice["max_disk_mb"] == 10
    job = live.submit("alice", cpu=0.5).json()["id"]
    live.plane.step()
    live.start(job)
    attempt = live.job(job).attempt
    live.engine.pending.append(JobUsage(job, attempt, live.engine.now, 0.5, cpu_s=1.0, disk_mb=20.0))
    live.plane.step()
    assert live.call("POST", f"/v1/jobs/{job}/suspend", "alice").status_code == 200
    live.engine.pending.append(JobExited(job, attempt, live.engine.now, 0, retryable=True))
    live.plane.step()
    assert live.job(job).phase == Phase.SUSPENDED
    never = live.submit("alice", cpu=0.5).json()["id"]
    bobs = live.submit("bob", cpu=0.5).json()["id"]
    live.plane.step()
    assert live.job(never).reason.startswith("waiting for disk") and live.job(bobs).phase in ADMITTED
    assert live.call("POST", f"/v1/jobs/{never}/cancel", "alice").status_code == 200
    assert live.call("POST", f"/v1/jobs/{job}/cancel", "alice").status_code == 200
    live.plane.step()
    assert live.plane.controller.tenant_disk_mb("alice") == 20.0  # the suspended job's, now ended
