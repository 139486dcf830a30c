"""The step a job shows is where its newest attempt is, not the furthest any attempt got."""

from __future__ import annotations

from pathlib import Path

from sluice.control.plane import ControlPlane
from sluice.model import JobExited, JobProgress, JobStarted, Phase
from sluice.model.progress import ProgressTracker
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import parse_job_spec
from sluice.store import MemoryStore

from .fake_engine import FakeEngine


def test_the_tracker_keeps_both_the_furthest_step_and_the_newest_attempts() -> None:
    tr = ProgressTracker()
    tr.report(1.0, 150, 0.5, attempt=1)
    tr.report(2.0, 69, 0.6, attempt=2)  # resumed from an older checkpoint
    tr.report(3.0, 140, 0.6, attempt=1)  # a late line of the old attempt moves neither
    tr.report(4.0, 73, 0.6, attempt=2)
    assert (tr.step, tr.attempt_step) == (150, 73)


def test_a_job_resumed_from_an_older_checkpoint_shows_the_step_it_is_at(tmp_path: Path) -> None:
    """After a crash at step 150 and a resume from the checkpoint at 69, `job get` and
    /metrics showed 150 while the new attempt reported 73 (sdkwalk s32). The policies still read
    the furthest step (ProgressTracker.step): what they decide on is unchanged."""
    engine = FakeEngine()
    plane = ControlPlane(Settings(home=tmp_path / "home"), MemoryStore(), engine, make_policy("kube"))
    ctl = plane.controller
    spec = parse_job_spec({"command": ["python", "t.py"], "resources": {"cpu": 1}, "max_restarts": 1})
    job = ctl.book.create("alice", spec)

    def run_attempt(step: int) -> int:
        for _ in range(30):  # a restart waits out its back-off
            engine.now += 10.0
            ctl.step()
            rec = ctl.book.get(job.id)
            assert rec is not None
            if rec.phase == Phase.STARTING:
                break
        assert rec.phase == Phase.STARTING, rec
        engine.pending.append(JobStarted(job.id, rec.attempt, "n0", engine.now))
        engine.pending.append(JobProgress(job.id, rec.attempt, engine.now + 1, step=step, loss=0.5))
        ctl.step()
        return rec.attempt

    first = run_attempt(150)
    engine.pending.append(JobExited(job.id, first, engine.now + 2, 3))
    ctl.step()
    second = run_attempt(69)
    assert second > first
    rec = ctl.book.get(job.id)
    assert rec is not None and rec.step == 69, rec
    assert ctl.progress(job.id).step == 150  # type: ignore[union-attr]
