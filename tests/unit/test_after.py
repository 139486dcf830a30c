"""`after`: a job that starts only once the jobs it names have succeeded (Slurm's
`--dependency=afterok`), in the controller under the FakeEngine (no processes)."""

from __future__ import annotations

import pytest

from sluice.control.controller import Controller
from sluice.model import JobExited, Phase
from sluice.spec import SpecError, parse_job_spec
from sluice.store import MemoryStore

from .fake_engine import FakeEngine
from .scripted_policy import Scripted
from .test_controller import spec, start


@pytest.fixture
def ctl() -> Controller:
    return Controller(MemoryStore(), FakeEngine(), Scripted(), checkpoint_root="/ckpt", restart_backoff_s=2.0)


def engine_of(ctl: Controller) -> FakeEngine:
    assert isinstance(ctl.engine, FakeEngine)
    return ctl.engine


def end(ctl: Controller, job_id: str, code: int) -> None:
    job = ctl.book.get(job_id)
    assert job is not None
    engine_of(ctl).pending.append(JobExited(job_id, job.attempt, engine_of(ctl).now, code, retryable=False))
    ctl.step()


def test_a_job_waits_for_the_jobs_it_starts_after_then_runs(ctl: Controller) -> None:
    first = ctl.submit("t", spec(name="prep"))
    second = ctl.submit("t", spec(name="prep2"))
    train = ctl.submit("t", spec(name="train", after=[first.id, second.id]))
    start(ctl, engine_of(ctl), first.id)
    rec = ctl.book.get(train.id)
    assert rec.phase == Phase.PENDING
    assert rec.reason.startswith(f"waiting for {first.id} (Running), {second.id} (")
    assert train.id not in [r.job_id for r in engine_of(ctl).launched]
    end(ctl, first.id, 0)
    start(ctl, engine_of(ctl), second.id)
    assert ctl.book.get(train.id).reason == f"waiting for {second.id} (Running) to succeed (after)"
    end(ctl, second.id, 0)
    ctl.step()
    assert ctl.book.get(train.id).phase in (Phase.QUEUED, Phase.STARTING)
    assert train.id in [r.job_id for r in engine_of(ctl).launched]


def test_a_job_after_one_that_failed_is_cancelled_without_starting(ctl: Controller) -> None:
    first = ctl.submit("t", spec(name="prep", max_restarts=0))
    train = ctl.submit("t", spec(name="train", after=[first.id]))
    evaluate = ctl.submit("t", spec(name="eval", after=[train.id]))
    start(ctl, engine_of(ctl), first.id)
    end(ctl, first.id, 3)
    ctl.step()
    rec = ctl.store.get_job(train.id)
    assert rec.phase == Phase.CANCELLED
    assert rec.reason == f"not started: job {first.id}, which it starts after, ended Failed"
    ctl.step()
    assert ctl.store.get_job(evaluate.id).phase == Phase.CANCELLED  # down the chain
    assert [r.job_id for r in engine_of(ctl).launched] == [first.id]


def test_a_held_job_takes_no_quota_and_a_suspended_predecessor_keeps_it_waiting(ctl: Controller) -> None:
    first = ctl.submit("t", spec(name="prep"))
    train = ctl.submit("t", spec(name="train", after=[first.id]))
    ctl.suspend(first.id)
    for _ in range(3):
        ctl.step()
    assert ctl.book.get(train.id).phase == Phase.PENDING
    assert "Suspended" in ctl.book.get(train.id).reason
    ctl.resume(first.id)
    start(ctl, engine_of(ctl), first.id)
    end(ctl, first.id, 0)
    ctl.step()
    assert ctl.book.get(train.id).phase != Phase.PENDING


def test_the_spec_bounds_the_list() -> None:
    assert parse_job_spec({"command": ["x"]}).after == []
    for bad, why in (
        ([f"j-{k}" for k in range(17)], "after"),
        (["j-1", "j-1"], "more than once"),
        (["../x"], "after.0"),
        ("j-1", "after"),
        ([""], "after.0"),
    ):
        with pytest.raises(SpecError) as err:
            parse_job_spec({"command": ["x"], "after": bad})
        assert why in str(err.value)


def test_after_any_starts_once_each_ended_however_it_ended(ctl: Controller) -> None:
    """Slurm's afterany: a gather after runs some of which fail. A predecessor that failed or
    was cancelled lets it start, where `after` would cancel it; one still running holds it,
    and the reason says which way it waits for each."""
    failing = ctl.submit("t", spec(name="run1", max_restarts=0))
    running = ctl.submit("t", spec(name="run2"))
    needed = ctl.submit("t", spec(name="prep"))
    gather = ctl.submit("t", spec(name="gather", after=[needed.id], after_any=[failing.id, running.id]))
    start(ctl, engine_of(ctl), failing.id)
    end(ctl, failing.id, 3)
    assert ctl.book.get(failing.id).phase == Phase.FAILED
    start(ctl, engine_of(ctl), running.id)
    start(ctl, engine_of(ctl), needed.id)
    rec = ctl.book.get(gather.id)
    assert rec.phase == Phase.PENDING  # a failed after_any job does not cancel it
    assert rec.reason == (
        f"waiting for {needed.id} (Running) to succeed (after) and for {running.id} (Running) to end (after_any)"
    )
    end(ctl, needed.id, 0)
    ctl.cancel(running.id, "by hand")
    end(ctl, running.id, -15)
    ctl.step()
    assert ctl.book.get(running.id).phase == Phase.CANCELLED
    assert ctl.book.get(gather.id).phase in (Phase.QUEUED, Phase.STARTING)
    assert gather.id in [r.job_id for r in engine_of(ctl).launched]


def test_after_any_of_a_job_already_gone_does_not_hold(ctl: Controller) -> None:
    """Only an ended job is forgotten (retention, `job delete`): one named in after_any that is
    no longer in the book has ended, and the job goes on; one named in `after` cancels it, as
    before (it cannot tell whether that one had succeeded)."""
    kept = ctl.submit("t", spec(name="a", after_any=["j-gone00000"]))
    cancelled = ctl.submit("t", spec(name="b", after=["j-gone00000"]))
    ctl.step()
    assert ctl.book.get(kept.id).phase in (Phase.QUEUED, Phase.STARTING)
    assert ctl.store.get_job(cancelled.id).phase == Phase.CANCELLED


def test_the_spec_bounds_after_any_with_after() -> None:
    assert parse_job_spec({"command": ["x"]}).after_any == []
    both = parse_job_spec({"command": ["x"], "after": ["j-1"], "after_any": ["j-2"]})
    assert both.predecessors == ["j-1", "j-2"]
    for bad, why in (
        ({"after_any": ["j-1", "j-1"]}, "after_any: 'j-1' is given more than once"),
        ({"after": ["j-1"], "after_any": ["j-1"]}, "after_any: 'j-1' is also in after"),
        (
            {"after": [f"a-{k}" for k in range(9)], "after_any": [f"b-{k}" for k in range(8)]},
            "at most 16 jobs together",
        ),
        ({"after_any": [f"b-{k}" for k in range(17)]}, "after_any"),
        ({"after_any": ["../x"]}, "after_any.0"),
    ):
        with pytest.raises(SpecError) as err:
            parse_job_spec({"command": ["x"], **bad})
        assert why in str(err.value), err.value
