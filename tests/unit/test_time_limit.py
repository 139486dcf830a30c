"""`max_runtime_s`: a job is held to the seconds it runs (Starting or Running), summed over its
attempts, under the FakeEngine's clock (no processes; time moves only when the test moves it)."""

from __future__ import annotations

import pytest

from sluice.control.controller import Controller
from sluice.control.recovery import recover
from sluice.model import JobCheckpointed, JobExited, JobProgress, Phase, Preempt, StopKind
from sluice.spec import SpecError, parse_job_spec
from sluice.store import MemoryStore

from .fake_engine import FakeEngine
from .scripted_policy import Scripted
from .test_controller import push, spec, start


@pytest.fixture
def setup() -> tuple[Controller, FakeEngine, MemoryStore]:
    store, engine = MemoryStore(), FakeEngine()
    return Controller(store, engine, Scripted(), checkpoint_root="/ckpt", restart_backoff_s=2.0), engine, store


def run_for(ctl: Controller, engine: FakeEngine, seconds: int) -> None:
    """One round a second for `seconds`."""
    for _ in range(seconds):
        engine.now += 1
        ctl.step()


def exit_stop(ctl: Controller, engine: FakeEngine, job_id: str, took: float = 2.0) -> None:
    """The job exits `took` seconds after it was asked to stop (a checkpointed stop: code 0)."""
    engine.now += took
    engine.pending.append(JobExited(job_id, ctl.book.get(job_id).attempt, engine.now, 0))  # type: ignore[union-attr]
    ctl.step()


def test_a_job_past_its_limit_is_stopped_through_its_checkpoint_and_fails(setup) -> None:  # type: ignore[no-untyped-def]
    ctl, engine, store = setup
    job = ctl.submit("t", spec(max_runtime_s=10))
    start(ctl, engine, job.id)
    run_for(ctl, engine, 9)
    assert ctl.book.get(job.id).phase == Phase.RUNNING and engine.stopped == []  # 9 s of 10
    run_for(ctl, engine, 1)
    rec = ctl.book.get(job.id)
    assert rec.phase == Phase.STOPPING and rec.stop_intent.kind == StopKind.TIME_LIMIT
    assert engine.stopped == [(job.id, 1, True)]  # a checkpointing stop, as a cancel's
    engine.pending.append(JobCheckpointed(job.id, 1, engine.now, 40, "/ckpt/x"))
    exit_stop(ctl, engine, job.id)
    final = store.get_job(job.id)
    assert final.phase == Phase.FAILED and final.checkpoint == "/ckpt/x"  # kept, for --resume-from
    assert final.reason.startswith("time limit: ran 10s, past its max_runtime_s of 10s; exit code 0")
    assert final.run_s == pytest.approx(10.0)  # the stop's 2 s are not counted


def test_the_seconds_of_every_attempt_add_up_but_not_stopping_or_suspended_ones(setup) -> None:  # type: ignore[no-untyped-def]
    ctl, engine, _ = setup
    job = ctl.submit("t", spec(max_runtime_s=10))
    start(ctl, engine, job.id)
    run_for(ctl, engine, 5)
    push(ctl, Preempt(job.id, "make room"))
    exit_stop(ctl, engine, job.id, took=5)  # stopping: not counted; placed again at once
    ctl.suspend(job.id)
    exit_stop(ctl, engine, job.id)
    assert ctl.book.get(job.id).phase == Phase.SUSPENDED
    ran = ctl.book.get(job.id).run_s
    assert 5 <= ran <= 7  # attempt 1's five seconds, and at most a round of each stop's ask
    run_for(ctl, engine, 100)  # suspended: not counted
    assert ctl.book.get(job.id).run_s == ran
    ctl.resume(job.id)
    start(ctl, engine, job.id)
    run_for(ctl, engine, int(10 - ran) - 1)
    assert ctl.book.get(job.id).phase == Phase.RUNNING
    run_for(ctl, engine, 2)
    assert ctl.book.get(job.id).stop_intent.kind == StopKind.TIME_LIMIT  # the attempts' seconds add up


def test_a_job_that_reported_its_last_step_as_time_ran_out_succeeds(setup) -> None:  # type: ignore[no-untyped-def]
    ctl, engine, store = setup
    job = ctl.submit("t", spec(max_runtime_s=5))
    start(ctl, engine, job.id)
    engine.pending.append(JobProgress(job.id, 1, engine.now, 100, 0.1, {"total_steps": 100}))
    run_for(ctl, engine, 5)
    assert ctl.book.get(job.id).stop_intent.kind == StopKind.TIME_LIMIT
    exit_stop(ctl, engine, job.id)
    assert store.get_job(job.id).phase == Phase.SUCCEEDED


def test_a_preemption_in_the_round_the_time_runs_out_is_not_made(setup) -> None:  # type: ignore[no-untyped-def]
    """The limit is checked before the policy acts: the job is not sent back to the queue (to
    run again) in the round its time runs out; its stop is the time limit's."""
    ctl, engine, store = setup
    job = ctl.submit("t", spec(max_runtime_s=10))
    start(ctl, engine, job.id)
    run_for(ctl, engine, 9)
    engine.now += 1
    push(ctl, Preempt(job.id, "make room"))
    assert ctl.book.get(job.id).stop_intent.kind == StopKind.TIME_LIMIT
    exit_stop(ctl, engine, job.id)
    assert store.get_job(job.id).phase == Phase.FAILED and len(engine.launched) == 1


def test_a_job_requeued_at_its_limit_fails_without_running_again(setup) -> None:  # type: ignore[no-untyped-def]
    ctl, engine, store = setup
    job = ctl.submit("t", spec(max_runtime_s=10))
    start(ctl, engine, job.id)
    run_for(ctl, engine, 9)
    push(ctl, Preempt(job.id, "make room"))
    ctl.book.observe(job.id, run_s=10.0)  # as another plane's store could hold it
    exit_stop(ctl, engine, job.id)  # requeued by the preemption, then held to its limit
    final = store.get_job(job.id)
    assert final.phase == Phase.FAILED and final.reason.startswith("time limit: ran 10s")
    assert [r.attempt for r in engine.launched] == [1]


def _restarted(store: MemoryStore, engine: FakeEngine, down_s: float) -> Controller:
    """A new plane on the same store after `down_s` seconds without one (its jobs ran on)."""
    engine.now += down_s
    ctl = Controller(store, engine, Scripted(), checkpoint_root="/ckpt", restart_backoff_s=2.0)
    recover(ctl)
    return ctl


def test_the_time_a_plane_was_down_counts_against_a_running_job(setup) -> None:  # type: ignore[no-untyped-def]
    ctl, engine, store = setup
    job = ctl.submit("t", spec(max_runtime_s=100))
    start(ctl, engine, job.id)
    run_for(ctl, engine, 30)
    ctl.book.flush(force=True)
    ctl.flush_held_time(force=True)
    engine.running = {job.id: 1}  # the plane dies here; the job runs on for 80 s
    ctl2 = _restarted(store, engine, 80)
    rec = ctl2.book.get(job.id)
    assert rec.phase == Phase.RUNNING and rec.run_s == pytest.approx(110.0)
    assert any("80s run while the plane was down counted" in e.message for e in store.events(job_id=job.id))
    ctl2.step()  # the first round holds it to its limit
    assert ctl2.book.get(job.id).stop_intent.kind == StopKind.TIME_LIMIT
    ctl2.flush_held_time(force=True)
    assert sum(h.run_s for h in store.held_time("t")) == pytest.approx(110.0)  # usage charges it too


def test_a_restarted_plane_charges_neither_a_queued_job_nor_one_that_died(setup) -> None:  # type: ignore[no-untyped-def]
    ctl, engine, store = setup
    ran = ctl.submit("t", spec(max_runtime_s=100))
    start(ctl, engine, ran.id)
    run_for(ctl, engine, 10)
    push(ctl, Preempt(ran.id, "make room"))
    exit_stop(ctl, engine, ran.id)  # back in the queue with 10 s run
    ran_s = ctl.book.get(ran.id).run_s
    died = ctl.submit("t", spec(max_runtime_s=100))
    start(ctl, engine, died.id)
    ctl.book.flush(force=True)
    engine.running = {}  # nothing runs while the plane is down
    ctl2 = _restarted(store, engine, 500)
    assert ctl2.book.get(ran.id).run_s == pytest.approx(ran_s)  # queued: nothing to charge
    assert ctl2.book.get(died.id).run_s < 2  # ended at an unknown time: not charged


def test_an_attempt_launched_just_before_the_plane_died_counts_from_its_launch(setup) -> None:  # type: ignore[no-untyped-def]
    ctl, engine, store = setup
    job = ctl.submit("t", spec(max_runtime_s=1000))
    start(ctl, engine, job.id)
    run_for(ctl, engine, 10)
    ctl.suspend(job.id)
    exit_stop(ctl, engine, job.id)
    ran_s = ctl.book.get(job.id).run_s
    engine.now += 200  # suspended for a while, then launched again
    ctl.resume(job.id)
    ctl.step()
    assert ctl.book.get(job.id).phase == Phase.STARTING and ctl.book.get(job.id).attempt == 2
    ctl.book.flush(force=True)
    engine.running = {job.id: 2}  # the plane dies before the start is confirmed
    ctl2 = _restarted(store, engine, 50)
    assert ctl2.book.get(job.id).run_s == pytest.approx(ran_s + 50)  # not the 200 s it waited


def test_no_limit_by_default_and_bad_limits_are_refused() -> None:
    assert parse_job_spec({"command": ["x"]}).max_runtime_s is None
    assert parse_job_spec({"command": ["x"], "max_runtime_s": 3600}).max_runtime_s == 3600
    for bad in (0, -1, 1e12, "nan", "inf", True, "1h"):
        with pytest.raises(SpecError) as err:
            parse_job_spec({"command": ["x"], "max_runtime_s": bad})
        assert "max_runtime_s" in str(err.value)


def test_a_crash_between_two_writes_never_charges_the_same_seconds_twice(setup) -> None:  # type: ignore[no-untyped-def]
    # Red team s27: a job's run_until and the tenant's held time were written on clocks of
    # their own (each every save_progress_every_s); a plane that died after writing held time
    # past the job's saved run_until charged that stretch again when it adopted the attempt.
    ctl, engine, store = setup
    job = ctl.submit("t", spec(max_runtime_s=1000))
    start(ctl, engine, job.id)
    for _ in range(7):  # rounds 1.5 s apart: the held time is written last at 1.5 s past the job
        engine.now += 1.5
        ctl.step()
    engine.running = {job.id: 1}  # the plane dies here; the job runs on
    ctl2 = _restarted(store, engine, 60)
    ctl2.book.flush(force=True)
    ctl2.flush_held_time(force=True)
    run_s = store.get_job(job.id).run_s
    assert sum(h.run_s for h in store.held_time("t")) <= run_s + 1e-6


def test_a_job_that_ended_while_the_plane_was_down_is_charged_to_its_exit(setup) -> None:  # type: ignore[no-untyped-def]
    # Red team s27: only an attempt still running when the plane came back was charged for
    # the time the plane was down; one whose exit (and its time) waited in the first poll was
    # charged nothing after run_until, however long it had run on.
    ctl, engine, store = setup
    job = ctl.submit("t", spec(max_runtime_s=1000))
    start(ctl, engine, job.id)
    run_for(ctl, engine, 30)
    ctl.book.flush(force=True)
    ctl.flush_held_time(force=True)
    engine.running = {}  # the plane dies here; the job runs on for 50 s, then exits
    engine.pending.append(JobExited(job.id, 1, engine.now + 50, 0))
    ctl2 = _restarted(store, engine, 80)
    ctl2.flush_held_time(force=True)
    done = store.get_job(job.id)
    assert done.phase == Phase.SUCCEEDED and done.run_s == pytest.approx(80.0)
    assert sum(h.run_s for h in store.held_time("t")) == pytest.approx(80.0)
