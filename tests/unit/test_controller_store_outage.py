"""The round while the store refuses writes: events it could not store are retried before the
engine is polled again, so no engine is told an event was stored that was not."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.control.plane import ControlPlane
from sluice.model import Event, JobExited, JobStarted, Phase
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import parse_job_spec
from sluice.store import StoreUnavailable

from .fake_engine import FakeEngine
from .test_book import BrokenStore


class CountingEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__()
        self.polls = 0

    def poll(self) -> list[Event]:
        self.polls += 1
        return super().poll()


def test_events_the_store_refused_are_retried_before_the_engine_is_polled_again(tmp_path: Path) -> None:
    """A node agent marks an exit reported at its next poll (the controller has stored what the
    last poll told by then). The round polled again while its backlog was unstored, so a crash
    during a store outage lost an exit the old way: the job ran once more, its retry uncounted
    (the crash campaign's window, left open in session 31)."""
    store, engine = BrokenStore(), CountingEngine()
    plane = ControlPlane(Settings(home=tmp_path / "home"), store, engine, make_policy("kube"))
    ctl = plane.controller
    job = ctl.book.create("alice", parse_job_spec({"command": ["python", "t.py"], "resources": {"cpu": 1}}))
    ctl.step()
    ctl.step()
    placed = ctl.book.get(job.id)
    assert placed is not None and placed.phase == Phase.STARTING, placed
    engine.pending.append(JobStarted(job.id, placed.attempt, "n0", engine.now))
    ctl.step()
    store.broken = True
    engine.pending.append(JobExited(job.id, placed.attempt, engine.now + 1, 3))
    with pytest.raises(StoreUnavailable):
        ctl.step()
    polls = engine.polls
    for _ in range(3):  # the outage goes on
        with pytest.raises(StoreUnavailable):
            ctl.step()
    assert engine.polls == polls, "the engine was polled while an exit it told was unstored"
    store.broken = False
    ctl.step()  # the backlog alone is stored
    done = ctl.book.get(job.id)
    assert done is not None and done.exit_code == 3, done
    assert engine.polls == polls
    ctl.step()
    assert engine.polls == polls + 1  # and then the engine is asked again


def test_a_job_whose_record_the_store_refuses_is_failed_from_the_record_it_last_took(tmp_path: Path) -> None:
    """A value a report put into a job's record that the store cannot hold (an int past 64
    bits: SQLite's OverflowError) made every write of that record fail, the one failing the
    job included: the job stayed live and its errors filled the log every round (sdkwalk s32).
    It is now failed from the record the store last took, without the refused observation."""
    from sluice.store.sql import SqlStore

    settings = Settings(home=tmp_path / "home")
    store = SqlStore(settings.db_url)
    plane = ControlPlane(settings, store, CountingEngine(), make_policy("kube"))
    ctl = plane.controller
    job = ctl.book.create("alice", parse_job_spec({"command": ["python", "t.py"], "resources": {"cpu": 1}}))
    ctl.book.observe(job.id, checkpoint="ckpt", checkpoint_step=2**70)
    ctl._contain(job.id, "testing", RuntimeError("boom"))
    assert not ctl.book.is_live(job.id)
    stored = store.get_job(job.id)
    assert stored is not None and stored.phase == Phase.FAILED, stored
    assert "unsaved progress was dropped" in stored.reason and stored.checkpoint_step != 2**70
    store.close()
