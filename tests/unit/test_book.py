"""The job book: one writer, atomic record + event, and crash safety at every failure point.

Crash tests arm a named failure point (control/failpoints.py), let the controller run into
it, then build a new controller on the same SQLite file and the same engine — what a
restarted control plane does — and check: no accepted job lost, none duplicated, none
resurrected after it finished, no attempt counted twice or run twice, restarts within
max_restarts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.control.book import JobBook
from sluice.control.controller import Controller
from sluice.control.failpoints import POINTS, FailpointCrash, Failpoints
from sluice.control.recovery import recover
from sluice.model import JobExited, JobProgress, JobRecord, JobStarted, Phase, StopKind
from sluice.policy import make_policy
from sluice.spec import parse_job_spec
from sluice.store import MemoryStore, StoreUnavailable
from sluice.store.sql import SqlStore

from .fake_engine import FakeEngine


def spec(**kw: object):
    return parse_job_spec({"command": ["python", "train.py"], "resources": {"cpu": 1}, **kw})


class BrokenStore(MemoryStore):
    """A MemoryStore whose writes fail on demand, as a full disk's would (a fake medium)."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def save_job(self, job, events=()):  # type: ignore[no-untyped-def]
        if self.broken:
            raise StoreUnavailable("the database cannot take writes: database or disk is full")
        super().save_job(job, events)


def test_a_failed_write_changes_nothing_in_memory_or_on_disk() -> None:
    store = BrokenStore()
    book = JobBook(store, lambda: 5.0)
    job = book.create("t", spec(), job_id="j1")
    store.broken = True
    with pytest.raises(StoreUnavailable):
        book.transition("j1", Phase.QUEUED, "admitted")
    assert book.get("j1") == job == store.get_job("j1")
    assert [e.kind for e in store.events(job_id="j1")] == ["phase"]  # no orphan event either
    store.broken = False
    moved = book.transition("j1", Phase.QUEUED, "admitted")
    assert store.get_job("j1") == moved and moved.phase == Phase.QUEUED


def test_observe_takes_only_facts_and_never_touches_a_finished_job() -> None:
    book = JobBook(MemoryStore(), lambda: 0.0)
    book.create("t", spec(), job_id="j1")
    with pytest.raises(ValueError, match="decisions, not observations"):
        book.observe("j1", phase=Phase.RUNNING)
    book.transition("j1", Phase.CANCELLED, "cancelled by t")
    assert book.observe("j1", step=10) is None
    done = book.get("j1")
    assert done is not None and done.step == 0 and done.finished_at == 0.0


def test_progress_is_written_at_most_every_interval_and_with_any_transition() -> None:
    now = [0.0]
    store = MemoryStore()
    book = JobBook(store, lambda: now[0], save_progress_every_s=5.0)
    book.create("t", spec(), job_id="j1")
    book.observe("j1", step=3)
    book.flush()
    assert store.get_job("j1").step == 0  # type: ignore[union-attr]
    now[0] = 6.0
    book.flush()
    assert store.get_job("j1").step == 3  # type: ignore[union-attr]
    book.observe("j1", step=9)
    book.transition("j1", Phase.QUEUED, "admitted")
    assert store.get_job("j1").step == 9  # type: ignore[union-attr]


def test_one_job_the_store_refuses_does_not_stop_the_others_progress(tmp_path: Path) -> None:
    """A real SQLite store refuses an integer past 64 bits; before, that one job's record made
    every flush (and so every round) fail. Progress reaches the book already bounded
    (`agent.progress_record`); this is the second line of defence."""
    store = SqlStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    book = JobBook(store, lambda: 10.0, save_progress_every_s=0.0)
    book.create("t", spec(), job_id="bad")
    book.create("t", spec(), job_id="good")
    book.observe("bad", step=2**70)
    book.observe("good", step=7)
    book.flush()  # no raise
    assert store.get_job("good").step == 7  # type: ignore[union-attr]
    assert store.get_job("bad").step == 0  # type: ignore[union-attr]
    book.observe("bad", step=8)
    book.flush()
    assert store.get_job("bad").step == 8  # type: ignore[union-attr]


def test_failpoints_reject_unknown_names_and_parse_the_setting() -> None:
    with pytest.raises(ValueError, match="unknown point"):
        Failpoints().arm("book.typo")
    fp = Failpoints.parse("book.create.after_write=raise@3, book.flush.before_write=exit")
    assert fp.armed == {"book.create.after_write": ("raise", 2), "book.flush.before_write": ("exit", 0)}
    fp.hit("book.create.after_write")
    fp.hit("book.create.after_write")
    with pytest.raises(FailpointCrash):
        fp.hit("book.create.after_write")
    fp.hit("book.create.after_write")  # fired once, then disarmed


# ---------------------------------------------------------------------- crash at every point


def _boot(db: Path, engine: FakeEngine, fp: Failpoints | None = None) -> Controller:
    return Controller(
        SqlStore(f"sqlite:///{db}"),
        engine,
        make_policy("kube"),
        checkpoint_root="/ckpt",
        restart_backoff_s=0.0,
        failpoints=fp,
        save_progress_every_s=0.0,
    )


def _script(ctl: Controller, engine: FakeEngine) -> list[str]:
    """A day in the life: submit, place, start, a crash retried, a cancel, a success."""
    ids = [ctl.submit("t", spec(max_restarts=1)).id for _ in range(3)]
    ctl.step()
    for jid in ids:
        job = ctl.book.get(jid)
        assert job is not None and job.phase == Phase.STARTING
        engine.pending.append(JobStarted(jid, job.attempt, "n0", engine.now))
        engine.pending.append(JobProgress(jid, job.attempt, engine.now, 5, 0.5))
    ctl.step()
    for jid in ids:
        job = ctl.book.get(jid)
        assert job is not None
        engine.pending.append(JobProgress(jid, job.attempt, engine.now + 1, 9, 0.4))
    ctl.step()
    first = ctl.book.get(ids[0])
    assert first is not None
    engine.pending.append(JobExited(ids[0], first.attempt, engine.now, 3))
    engine.running.pop(ids[0], None)
    ctl.cancel(ids[1])
    ctl.step()
    second = ctl.book.get(ids[2])
    assert second is not None
    engine.pending.append(JobExited(ids[2], second.attempt, engine.now, 0))
    engine.running.pop(ids[2], None)
    ctl.step()
    return ids


def _invariants(ctl: Controller, engine: FakeEngine, acked: list[str], finished: dict[str, JobRecord]) -> None:
    stored = {j.id: j for j in ctl.store.list_jobs()}
    assert set(acked) <= set(stored), "an acknowledged job was lost"
    assert len(stored) == len(set(stored)), "a job was duplicated"
    for jid, done in finished.items():
        assert stored[jid].phase == done.phase, f"{jid} finished as {done.phase}, now {stored[jid].phase}"
    for job in stored.values():
        assert job.restarts <= job.spec.max_restarts
        launches = [r.attempt for r in engine.launched if r.job_id == job.id]
        assert len(launches) == len(set(launches)), f"{job.id}: an attempt was launched twice"
        assert not launches or max(launches) <= job.attempt, f"{job.id}: a launch the book does not know"
        if job.phase.terminal:
            assert (
                job.id not in engine.running
                or engine.running[job.id] != job.attempt
                or ((job.id, job.attempt, False) in engine.stopped or (job.id, job.attempt, True) in engine.stopped)
            )


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("nth", [1, 3])
def test_a_crash_at_any_failure_point_loses_duplicates_and_resurrects_nothing(
    tmp_path: Path, point: str, nth: int
) -> None:
    db = tmp_path / "sluice.db"
    engine = FakeEngine()
    fp = Failpoints()
    fp.arm(point, "raise", nth)  # crash on the nth time this point is reached
    ctl = _boot(db, engine, fp)
    acked: list[str] = []
    orig_submit = ctl.submit

    def submit(*a, **kw):  # type: ignore[no-untyped-def]
        job = orig_submit(*a, **kw)
        acked.append(job.id)  # returned to the caller = acknowledged
        return job

    ctl.submit = submit  # type: ignore[method-assign]
    crashed = False
    try:
        _script(ctl, engine)
    except FailpointCrash:
        crashed = True
    finished = {j.id: j for j in ctl.store.list_jobs() if j.phase.terminal}

    ctl2 = _boot(db, engine)  # the restarted control plane
    recover(ctl2)
    for _ in range(3):
        ctl2.step()
    _invariants(ctl2, engine, acked, finished)
    assert crashed, f"the script never reached {point} {nth} time(s): this case tested nothing"
    # After the restart, the plane carries on: every job reaches an end once its process ends.
    for _ in range(5):
        for job in ctl2.book.live():
            if job.phase.active:
                engine.pending.append(JobStarted(job.id, job.attempt, "n0", engine.now))
                engine.pending.append(JobExited(job.id, job.attempt, engine.now, 0))
                engine.running.pop(job.id, None)
        ctl2.step()
    _invariants(ctl2, engine, acked, finished)
    cancelled = [j for j in ctl2.store.list_jobs() if j.phase == Phase.CANCELLED]
    for j in cancelled:
        later = [r for r in engine.launched if r.job_id == j.id and r.attempt > j.attempt]
        assert not later, "a cancelled job ran again"


def test_a_cancel_in_flight_survives_a_restart_and_the_job_never_runs_again(tmp_path: Path) -> None:
    """The bug in the issue: a job being stopped for a cancel, whose process is gone when the
    control plane comes back, was requeued and relaunched on every restart."""
    db = tmp_path / "sluice.db"
    engine = FakeEngine()
    ctl = _boot(db, engine)
    jid = ctl.submit("t", spec()).id
    ctl.step()
    engine.pending.append(JobStarted(jid, 1, "n0", engine.now))
    ctl.step()
    ctl.cancel(jid, "cancelled by t")
    stopping = ctl.book.get(jid)
    assert stopping is not None and stopping.stop_intent is not None
    assert stopping.stop_intent.kind == StopKind.CANCEL
    engine.running.pop(jid)  # the process ends while the plane is down; no exit code kept
    for _ in range(3):  # restart, again and again
        ctl = _boot(db, engine)
        recover(ctl)
        ctl.step()
    final = ctl.store.get_job(jid)
    assert final is not None and final.phase == Phase.CANCELLED and final.attempt == 1
    assert [r.attempt for r in engine.launched if r.job_id == jid] == [1]


def test_a_preemption_in_flight_survives_a_restart_and_resumes(tmp_path: Path) -> None:
    db = tmp_path / "sluice.db"
    engine = FakeEngine()
    ctl = _boot(db, engine)
    jid = ctl.submit("t", spec(max_restarts=0)).id
    ctl.step()
    engine.pending.append(JobStarted(jid, 1, "n0", engine.now))
    ctl.step()
    node = ctl.book.get(jid).allocation.primary_node  # type: ignore[union-attr]
    ctl.set_node_health(node, ctl.node(node).health.__class__("Cordoned"), "disk failing")  # type: ignore[union-attr]
    ctl = _boot(db, engine)  # crash while it is Stopping
    recover(ctl)
    engine.pending.append(JobExited(jid, 1, engine.now, 0))  # it checkpointed and exited
    engine.running.pop(jid)
    ctl.step()
    job = ctl.store.get_job(jid)
    assert job is not None and job.phase == Phase.STARTING and job.attempt == 2, job.reason
    assert job.restarts == 0, "a preemption is not a failure"


class CountingStore(MemoryStore):
    """A MemoryStore that counts the job rows its lists hand back."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = 0

    def list_jobs(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = super().list_jobs(*args, **kwargs)
        self.rows += len(out)
        return out


def test_a_page_of_jobs_reads_the_store_for_ended_jobs_only_and_pages_exactly() -> None:
    """A page merges the ended jobs (from the store) with the live ones (from the book), both
    in key order: a tenant with thousands of queued jobs cost a read of every one of them for
    each page (they were read from the store, then skipped as live)."""
    store = CountingStore()
    t = [0.0]
    book = JobBook(store, lambda: t[0])
    ids = []
    for i in range(1000):
        t[0] = float(i)
        ids.append(book.create("alice", spec()).id)
    for job_id in ids[::7]:  # some ended, spread among the live
        book.transition(job_id, Phase.CANCELLED, "cancelled")
    book.flush(force=True)
    store.rows = 0
    first = book.query(tenant="alice", limit=50)
    assert store.rows <= 50, store.rows  # at most a page of ended jobs, not the 1,000
    seen, after = [j.id for j in first], (first[-1].submitted_at, first[-1].id)
    while page := book.query(tenant="alice", limit=50, after=after):
        seen += [j.id for j in page]
        after = (page[-1].submitted_at, page[-1].id)
    assert seen == ids  # every job once, in submit order, ended and live alike
    live = book.query(tenant="alice", phases=[Phase.PENDING], limit=10)
    assert [j.id for j in live] == [i for i in ids if i not in ids[::7]][:10]
    store.rows = 0
    book.query(tenant="alice", phases=[Phase.PENDING, Phase.RUNNING], limit=10)
    assert store.rows == 0  # only live phases asked for: the store is not read
    assert [j.id for j in book.query(tenant="alice", phases=[Phase.CANCELLED], limit=3)] == ids[::7][:3]


def test_a_name_no_job_id_can_have_is_no_job_without_asking_the_store() -> None:
    """PostgreSQL's driver raises on a NUL in a query parameter: `GET /v1/jobs/a%00b` was a
    500 there (red team s28). The book answers such names itself."""

    class Refusing(MemoryStore):
        def get_job(self, job_id):  # type: ignore[no-untyped-def]
            raise AssertionError(f"store asked for {job_id!r}")

        def events(self, *a, **kw):  # type: ignore[no-untyped-def]
            raise AssertionError("store asked for events")

    book = JobBook(Refusing(), lambda: 0.0)
    for bad in ("a\x00b", "", "../x", "x" * 65, "-leading", "a/b", "a b"):
        assert book.get(bad) is None and book.events(bad) == [], bad
    with pytest.raises(AssertionError, match="store asked"):
        book.get("j-0123456789")  # a real id still reads the store
