"""A control-plane crash between an elastic resize's stop and its relaunch (issue 12), against
the FakeEngine and the book's failpoints: wherever the crash falls, the restarted plane
finishes the resize — relaunching at the target size from the checkpoint — or, when nothing
is left to say what the job was doing, requeues it for the policy; never a failure restart,
never two attempts, never a job stuck in Stopping."""

from __future__ import annotations

import pytest

from sluice.control.controller import Controller
from sluice.control.failpoints import FailpointCrash
from sluice.control.recovery import recover
from sluice.model import JobExited, JobProgress, Phase, Resize
from sluice.store import MemoryStore

from .fake_engine import FakeEngine
from .scripted_policy import Scripted
from .test_elastic_resize import gang, started


def restarted(ctl: Controller, engine: FakeEngine) -> Controller:
    """A new control plane on the same store and engine, as after a kill -9 (jobs keep running)."""
    store = ctl.store
    assert isinstance(store, MemoryStore)
    ctl2 = Controller(store, engine, Scripted(), checkpoint_root="/c", restart_backoff_s=0.0)  # type: ignore[arg-type]
    recover(ctl2)
    return ctl2


def checkpointed_exit(engine: FakeEngine, jid: str, attempt: int, step: int) -> None:
    engine.now += 2.0
    engine.running.pop(jid, None)
    engine.pending += [
        JobProgress(jid, attempt, engine.now, step, 0.5, {"total_steps": 1000}),
        JobExited(jid, attempt, engine.now, 0),
    ]


def assert_resized_once(ctl: Controller, engine: FakeEngine, jid: str) -> None:
    job = ctl.book.get(jid)
    assert job is not None and job.phase == Phase.STARTING and job.attempt == 2
    assert job.restarts == 0 and job.allocation == gang(2)
    assert [(r.attempt, r.allocation.replicas) for r in engine.launched if r.job_id == jid] == [(1, 1), (2, 2)]
    assert job.reason.startswith("resized 1 → 2 replicas"), job.reason


def test_crash_after_the_stop_is_recorded_but_before_the_job_is_told() -> None:
    """The Stopping record (with its intent) is on disk, SIGTERM was never sent: the restarted
    plane adopts the live attempt and sends the stop again, else the job would sit in
    Stopping forever with nobody asking it to checkpoint."""
    ctl, engine, pol, jid = started(1, 2)
    ctl.book.failpoints.arm("book.transition.after_write")
    pol.push(Resize(jid, gang(2), "grow"))
    with pytest.raises(FailpointCrash):
        ctl.step()
    assert engine.stopped == []  # the crash came first
    ctl2 = restarted(ctl, engine)
    job = ctl2.book.get(jid)
    assert job is not None and job.phase == Phase.STOPPING and job.stop_intent is not None
    assert engine.stopped == [(jid, 1, True)]  # asked again, through the checkpoint
    checkpointed_exit(engine, jid, 1, 120)
    ctl2.step()
    assert_resized_once(ctl2, engine, jid)


def test_the_job_checkpoints_and_exits_while_the_plane_is_down() -> None:
    """The exit code kept by the agent arrives in the restarted plane's first poll and is read
    through the persisted resize intent: relaunched at the target size at once."""
    ctl, engine, pol, jid = started(1, 2)
    pol.push(Resize(jid, gang(2), "grow"))
    ctl.step()
    assert engine.stopped == [(jid, 1, True)]
    checkpointed_exit(engine, jid, 1, 120)  # ... while no plane watches
    ctl2 = restarted(ctl, engine)
    assert_resized_once(ctl2, engine, jid)
    assert "stopped for resize" in " ".join(e.message for e in ctl2.book.events(jid))


def test_the_job_is_gone_without_an_exit_code() -> None:
    """Nothing says how the attempt ended (its node's agent lost the exit code too): requeued
    to resume from its checkpoint, not counted as a failure; the policy places it anew."""
    ctl, engine, pol, jid = started(1, 2)
    pol.push(Resize(jid, gang(2), "grow"))
    ctl.step()
    engine.running.pop(jid)
    ctl2 = restarted(ctl, engine)
    job = ctl2.book.get(jid)
    assert job is not None and job.phase == Phase.QUEUED and job.restarts == 0 and job.stop_intent is None
    ctl2.step()
    job = ctl2.book.get(jid)
    assert job is not None and job.phase == Phase.STARTING and job.attempt == 2 and job.restarts == 0
    assert sum(1 for r in engine.launched if r.job_id == jid) == 2
