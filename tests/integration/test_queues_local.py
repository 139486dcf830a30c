"""Queues on the local engine, with real job processes: two tenants in a cohort borrowing and
reclaiming, the preempted borrower resuming from its checkpoint, a quota changed live through
the CLI, suspend/resume, --resume-from (same tenant only), and a chain of jobs (`after`) with
a time limit."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluice.cli.main import app as cli
from sluice.control.errors import Conflict, NotFound
from sluice.control.plane import ControlPlane
from sluice.control.retention import DAY_S
from sluice.model import JobRecord, Phase
from sluice.settings import Settings
from sluice.spec import GrantSpec, PriorityClassSpec, QueueSpec, SpecError, TenantSpec, parse_job_spec
from sluice.store import TenantRecord

from ..live_api import serve_for_cli
from .conftest import JOBS, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def plane(sluice_settings: Settings) -> Iterator[ControlPlane]:
    settings = sluice_settings.model_copy(
        update={"reconcile_interval_s": 0.1, "preempt_min_runtime_s": 0.0, "policy": "kube", "node_cpus": 2.0}
    )
    p = ControlPlane.from_settings(settings)
    p.tokens = p.bootstrap_tenants()  # type: ignore[attr-defined]
    p.start()
    yield p
    admin = p.store.get_tenant("admin")
    assert admin is not None
    for j in p.list_jobs(admin):
        if not j.phase.terminal:
            p.cancel(admin, j.id)
    wait_for(lambda: all(j.phase.terminal for j in p.list_jobs(admin)), 20)
    p.stop()


def loop(queue: str = "default", cpu: float = 0.25, **kw: object):  # type: ignore[no-untyped-def]
    return parse_job_spec(
        {
            "command": ["python", str(JOBS / "sdk_loop.py"), "--sleep", "0.05"],
            "workdir": str(JOBS),
            "queue": queue,
            "resources": {"cpu": {"min": cpu, "max": cpu}},
            "checkpoint": {"interval_s": 0.5},
            **kw,
        }
    )


def get(p: ControlPlane, job: JobRecord) -> JobRecord:
    return p.controller.book.get(job.id)  # type: ignore[return-value]


def why(p: ControlPlane, job: JobRecord) -> list[str]:
    return [e.message for e in p.controller.book.events(job.id)]


def tenant(p: ControlPlane, name: str) -> TenantRecord:
    admin = p.store.get_tenant("admin")
    assert admin is not None
    p.create_tenant(admin, TenantSpec(name=name))
    rec = p.store.get_tenant(name)
    assert rec is not None
    return rec


def running(p: ControlPlane, job: JobRecord) -> bool:
    j = get(p, job)
    return j.phase == Phase.RUNNING and j.step > 3


def test_two_tenants_in_a_cohort_borrow_and_reclaim_and_the_borrower_resumes(plane: ControlPlane) -> None:
    p = plane
    admin = p.store.get_tenant("admin")
    assert admin is not None
    alice, bob = tenant(p, "alice"), tenant(p, "bob")
    for q, t in (("research", alice), ("ml", bob)):
        p.create_queue(admin, QueueSpec.model_validate({"name": q, "cohort": "lab", "nominal": {"cores": 0.5}}))
        p.grant_queue(admin, q, GrantSpec(tenant=t.name))

    a = [p.submit(alice, loop("research")) for _ in range(4)]  # 1 core: 0.5 nominal + 0.5 borrowed
    for j in a:
        assert wait_for(lambda j=j: running(p, j), 60), get(p, j).reason
    assert any("borrowing 0.5 of 0.5 from cohort lab" in m for m in why(p, a[-1]))
    research = next(q for q in p.list_queues(admin) if q.name == "research")
    assert research.borrowed == {"cores": 0.5} and research.admitted == 4

    b = p.submit(bob, loop("ml", priority=0))  # in ml's nominal quota: reclaimed from research
    assert wait_for(lambda: running(p, b), 60), get(p, b).reason
    victims = [j for j in a if any("reclaims its nominal quota" in m for m in why(p, j))]
    assert len(victims) == 1
    victim = victims[0]
    assert wait_for(lambda: get(p, victim).phase == Phase.PENDING, 30)
    v = get(p, victim)
    assert v.checkpoint is not None and v.checkpoint_step is not None
    step_at_stop = v.checkpoint_step
    assert "cohort lab has 0 of the 1 cores its queues share free" in v.reason  # it waits, with the quota reason
    # alice reads neither bob's job id nor the name of ml, a queue she is not granted
    assert not any(b.id in m or "queue ml" in m for m in why(p, victim))
    assert any("another queue of cohort lab reclaims its nominal quota" in m for m in why(p, victim))

    p.cancel(bob, b.id)  # ml gives its quota back: the borrower comes back, from its checkpoint
    assert wait_for(lambda: running(p, victim), 60), get(p, victim).reason
    assert any(f"resumes from checkpoint at step {step_at_stop}" in m for m in why(p, victim))
    log = Path(p.engine.log_path(victim.id) or "")
    assert wait_for(lambda: f"resumed at step {step_at_stop + 1}" in log.read_text(), 30)


def test_a_quota_changed_live_through_the_cli_admits_the_waiting_job(
    plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = plane
    runner = CliRunner()
    with serve_for_cli(p, p.settings.home, p.tokens, monkeypatch):  # type: ignore[attr-defined]
        r = runner.invoke(cli, ["queue", "create", "solo", "--cores", "0.25"])
        assert r.exit_code == 0, r.output
        r = runner.invoke(cli, ["queue", "grant", "solo", "default"])
        assert r.exit_code == 0, r.output
        caller = p.store.get_tenant("default")
        assert caller is not None
        first, second = p.submit(caller, loop("solo")), p.submit(caller, loop("solo"))
        assert wait_for(lambda: get(p, first).phase == Phase.RUNNING, 60)
        assert wait_for(lambda: "nominal" in get(p, second).reason, 30)
        assert get(p, second).phase == Phase.PENDING
        assert get(p, second).reason.startswith("queue solo: cores 0.25/0.25 nominal, needs 0.25 more")
        r = runner.invoke(cli, ["queue", "list"])
        assert r.exit_code == 0 and "solo" in r.output and "cores=0.25" in r.output

        r = runner.invoke(cli, ["queue", "set", "solo", "--cores", "0.5"])
        assert r.exit_code == 0, r.output
        assert wait_for(lambda: get(p, second).phase == Phase.RUNNING, 60), get(p, second).reason

        r = runner.invoke(cli, ["job", "why", second.id])
        assert r.exit_code == 0 and "admitted to queue solo: cores 0.5/0.5 nominal" in r.output


def test_a_queue_not_granted_is_a_422_naming_queue(plane: ControlPlane) -> None:
    p = plane
    admin = p.store.get_tenant("admin")
    assert admin is not None
    p.create_queue(admin, QueueSpec(name="private"))
    caller = p.store.get_tenant("default")
    assert caller is not None
    with pytest.raises(SpecError) as err:
        p.submit(caller, loop("private"))
    assert [pr.field for pr in err.value.problems] == ["queue"]


def test_suspend_resume_and_resume_from_another_job_of_the_same_tenant(plane: ControlPlane) -> None:
    p = plane
    caller = p.store.get_tenant("default")
    assert caller is not None
    job = p.submit(caller, loop())
    assert wait_for(lambda: running(p, job) and get(p, job).step > 10, 60)
    p.suspend(caller, job.id)
    assert wait_for(lambda: get(p, job).phase == Phase.SUSPENDED, 30), get(p, job).reason
    s = get(p, job)
    assert s.allocation is None and s.checkpoint_step is not None
    at = s.checkpoint_step

    p.resume(caller, job.id)
    assert wait_for(lambda: running(p, job), 60), get(p, job).reason
    log = Path(p.engine.log_path(job.id) or "")
    assert wait_for(lambda: f"resumed at step {at + 1}" in log.read_text(), 30)

    p.cancel(caller, job.id)
    assert wait_for(lambda: get(p, job).phase == Phase.CANCELLED, 30)
    last = get(p, job).checkpoint_step
    assert last is not None and last >= at

    other = tenant(p, "mallory")
    with pytest.raises(SpecError, match="you have no job"):  # another tenant's job reads as one that does not exist
        p.submit(other, loop(resume_from=job.id))

    again = p.submit(caller, loop(resume_from=job.id))
    assert wait_for(lambda: running(p, again), 60), get(p, again).reason
    log2 = Path(p.engine.log_path(again.id) or "")
    assert wait_for(lambda: f"resumed at step {last + 1}" in log2.read_text(), 30)
    assert any(f"starts from job {job.id}'s checkpoint at step {last}" in m for m in why(p, again))

    never = p.submit(caller, loop())  # cancelled before it could checkpoint
    p.cancel(caller, never.id)
    assert wait_for(lambda: get(p, never).phase == Phase.CANCELLED, 30)
    with pytest.raises(Conflict, match="left no checkpoint to resume from"):  # not a silent start from 0
        p.submit(caller, loop(resume_from=never.id))


def test_a_high_priority_class_preempts_a_low_job_in_the_default_queue_which_resumes(plane: ControlPlane) -> None:
    p = plane
    admin = p.store.get_tenant("admin")
    assert admin is not None
    alice = tenant(p, "alice")
    p.create_priority_class(admin, PriorityClassSpec(name="high", value=100))
    low = p.submit(alice, loop(cpu=2.0))  # fills the node; default queue, no quota
    assert wait_for(lambda: running(p, low), 60), get(p, low).reason

    high = p.submit(alice, loop(cpu=2.0, priority_class="high"))
    assert get(p, high).spec.priority == 100
    assert wait_for(lambda: running(p, high), 60), get(p, high).reason
    assert any(f"preempted to place {high.id}" in m and "priority 100 > 0" in m for m in why(p, low))
    v = get(p, low)
    assert v.phase in (Phase.PENDING, Phase.QUEUED) and v.checkpoint_step is not None
    step_at_stop = v.checkpoint_step

    p.cancel(alice, high.id)  # the node is free again: the low job resumes from its checkpoint
    assert wait_for(lambda: running(p, low), 60), get(p, low).reason
    assert any(f"resumes from checkpoint at step {step_at_stop}" in m for m in why(p, low))
    log = Path(p.engine.log_path(low.id) or "")
    assert wait_for(lambda: f"resumed at step {step_at_stop + 1}" in log.read_text(), 30)


def test_a_job_after_another_runs_once_it_succeeds_and_is_stopped_at_its_time_limit(plane: ControlPlane) -> None:
    """Real processes: `first` (40 steps) succeeds; `second`, after it, waits Pending meanwhile,
    then runs until its max_runtime_s, is stopped through its checkpoint (the SDK saves on the
    stop) and ends Failed saying so; `third`, after `second`, is then cancelled unstarted."""
    p = plane
    caller = p.store.get_tenant("default")
    assert caller is not None
    first = p.submit(caller, loop(name="first", command=["python", str(JOBS / "sdk_loop.py"), "--steps", "40"]))
    second = p.submit(caller, loop(name="second", cpu=1, after=[first.id], max_runtime_s=3))
    third = p.submit(caller, loop(name="third", after=[second.id]))
    assert wait_for(lambda: get(p, first).phase == Phase.RUNNING, 30), get(p, first).reason
    assert get(p, second).phase == Phase.PENDING and get(p, second).reason.startswith(f"waiting for {first.id}")
    assert wait_for(lambda: get(p, second).phase.terminal, 60), get(p, second).reason
    done, limited = get(p, first), get(p, second)
    assert done.phase == Phase.SUCCEEDED and limited.phase == Phase.FAILED
    assert limited.started_at is not None and done.finished_at is not None
    assert limited.started_at >= done.finished_at  # it waited for `first`
    assert limited.reason.startswith("time limit: ran 3s, past its max_runtime_s of 3s"), limited.reason
    assert limited.checkpoint_step is not None and limited.step > 0  # it ran, and kept a checkpoint
    assert wait_for(lambda: get(p, third).phase == Phase.CANCELLED, 10), get(p, third).reason
    assert get(p, third).attempt == 0  # never launched


def test_retention_forgets_ended_jobs_with_their_folders_but_not_one_a_live_job_waits_for(plane: ControlPlane) -> None:
    """Real processes and run folders: two jobs succeed (their logs and checkpoint folders on disk); a third
    waits for one of them and for a job still running. A retention pass 92 days on (the
    default keeps 90; the pass is run with its clock moved) forgets the free one — record,
    events, folder — and keeps the one waited for; once nothing waits, that one goes too."""
    p = plane
    assert p.retention is not None and p.settings.job_retention_days == 90
    retention = p.retention.retention
    caller = p.store.get_tenant("default")
    assert caller is not None
    short = ["python", str(JOBS / "sdk_loop.py"), "--steps", "20"]
    kept = p.submit(caller, loop(name="kept", command=short))
    free = p.submit(caller, loop(name="free", command=short))
    for j in (kept, free):
        assert wait_for(lambda j=j: get(p, j).phase == Phase.SUCCEEDED, 60), get(p, j).reason
    long = p.submit(caller, loop(name="long"))
    waiting = p.submit(caller, loop(name="waiting", after=[kept.id, long.id]))
    assert wait_for(lambda: running(p, long), 30), get(p, long).reason
    runs = p.settings.runs_dir
    assert (runs / free.id / "job.log").exists() and (runs / free.id / "checkpoints").is_dir()

    later = retention.run(time.time() + 92 * DAY_S)  # past the 90 days
    assert (later.jobs, later.kept) == (1, 1), later
    assert p.store.get_job(free.id) is None and p.store.get_job(kept.id) is not None
    assert not (runs / free.id).exists() and (runs / kept.id / "job.log").exists()
    assert p.store.events(job_id=free.id) == [] and get(p, waiting).phase == Phase.PENDING
    with pytest.raises(NotFound):
        p.get_job(caller, free.id)

    p.cancel(caller, long.id)  # `waiting` can never start now: it is cancelled, and nothing waits
    assert wait_for(lambda: get(p, waiting).phase == Phase.CANCELLED and get(p, long).phase.terminal, 30)
    last = retention.run(time.time() + 91 * DAY_S)
    assert last.jobs == 3 and last.kept == 0, last
    assert [j.id for j in p.list_jobs(caller)] == []
    assert not any((runs / j.id).exists() for j in (kept, long, waiting))


def test_job_delete_through_the_cli_forgets_an_ended_job_and_its_folder_at_once(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real processes and run folders: a job that succeeded is deleted by its tenant through the
    CLI, record, events and folder (its log and checkpoints), the moment it ended; a running
    job is refused and keeps its folder."""
    p = plane
    caller = p.store.get_tenant("default")
    assert caller is not None
    done = p.submit(caller, loop(name="done", command=["python", str(JOBS / "sdk_loop.py"), "--steps", "20"]))
    long = p.submit(caller, loop(name="long"))
    assert wait_for(lambda: get(p, done).phase == Phase.SUCCEEDED and running(p, long), 60), get(p, done).reason
    runs = p.settings.runs_dir
    assert (runs / done.id / "job.log").exists() and (runs / done.id / "checkpoints").is_dir()
    runner = CliRunner()
    with serve_for_cli(p, p.settings.home, p.tokens, monkeypatch):  # type: ignore[attr-defined]
        r = runner.invoke(cli, ["job", "delete", long.id, done.id])
        assert r.exit_code == 1, r.output
        assert f"{done.id}: deleted" in r.output and "run folders removed: 1" in r.output
        assert f"job {long.id} is Running: only an ended job can be deleted" in r.output
    assert not (runs / done.id).exists() and (runs / long.id / "job.log").exists()
    assert p.store.get_job(done.id) is None and p.store.events(job_id=done.id) == []
    assert get(p, long).phase == Phase.RUNNING


def test_a_job_ended_before_its_processes_is_deleted_only_once_they_are_gone(plane: ControlPlane) -> None:
    """A job can end before its node saw its processes go (an internal error fails it and
    kills them; a gang's or a job's node lost). Deleted at once, its folder went from under
    processes still writing there (files unlinked, counted against no one); now the delete is
    refused until the node says they exited. And a folder gone before the node agent finished
    the attempt (removed by hand, a shared disk lost) stops nothing else: its marker file
    used to raise out of every poll of the node, on the local engine out of every round."""
    p = plane
    caller = p.store.get_tenant("default")
    assert caller is not None
    victim, other = p.submit(caller, loop(name="victim")), p.submit(caller, loop(name="other"))
    gone = p.submit(caller, loop(name="gone"))
    assert wait_for(lambda: all(running(p, j) for j in (victim, other, gone)), 60), get(p, victim).reason
    assert p.engine.still_running([victim.id, "j-0000000000"]) == [victim.id]  # type: ignore[attr-defined]
    with p.controller.lock:  # no round between the failure and the delete
        p.controller._contain(victim.id, "testing", RuntimeError("boom"))
        assert get(p, victim).phase == Phase.FAILED
        with pytest.raises(Conflict, match=f"job {victim.id} is Failed, but its processes on its node have not"):
            p.delete_job(caller, victim.id)
        p.controller._contain(gone.id, "testing", RuntimeError("boom"))
        shutil.rmtree(p.settings.runs_dir / gone.id)
    assert p.store.get_job(victim.id) is not None and (p.settings.runs_dir / victim.id).is_dir()
    assert wait_for(lambda: p.engine.still_running([victim.id, gone.id]) == [], 30)  # type: ignore[attr-defined]
    assert p.delete_job(caller, victim.id).ids == [victim.id]
    assert not (p.settings.runs_dir / victim.id).exists()
    p.cancel(caller, other.id)
    assert wait_for(lambda: get(p, other).phase == Phase.CANCELLED, 30), get(p, other).reason
