"""CPU-seconds used: counted from the nodes' per-attempt counters (JobUsage.cpu_s) into the
job (`cpu_used_s`) and its tenant's usage by hour, once each, across attempts, lost samples,
re-sent readings and a plane restart (FakeEngine; time moves only when the test moves it)."""

from __future__ import annotations

import pytest

from sluice.control.controller import Controller
from sluice.control.recovery import recover
from sluice.control.usage import by_tenant
from sluice.engine.ray_gang import GangBook
from sluice.model import JobExited, JobUsage, Phase
from sluice.store import MemoryStore

from .fake_engine import FakeEngine
from .scripted_policy import Scripted
from .test_controller import spec, start


def _controller(store: MemoryStore, engine: FakeEngine) -> Controller:
    return Controller(store, engine, Scripted(), checkpoint_root="/ckpt", restart_backoff_s=0.0)


def _reading(ctl: Controller, engine: FakeEngine, job_id: str, cpu_s: float, attempt: int | None = None) -> None:
    attempt = ctl.book.get(job_id).attempt if attempt is None else attempt  # type: ignore[union-attr]
    engine.now += 1
    engine.pending.append(JobUsage(job_id, attempt, engine.now, 1.0, cpu_s=cpu_s))
    ctl.step()


def test_readings_add_what_is_past_the_last_one_across_attempts() -> None:
    store, engine = MemoryStore(), FakeEngine()
    ctl = _controller(store, engine)
    job = ctl.submit("alice", spec())
    start(ctl, engine, job.id)
    for total in (2.0, 5.0, 5.0, 4.0, 9.5):  # one re-sent, one lower (a process tree's sum can dip)
        _reading(ctl, engine, job.id, total)
    assert ctl.book.get(job.id).cpu_used_s == pytest.approx(9.5)
    _reading(ctl, engine, job.id, 100.0, attempt=0)  # an older attempt's: ignored
    engine.pending.append(JobExited(job.id, 1, engine.now, 1))  # fails, is retried
    ctl.step()
    start(ctl, engine, job.id)
    assert ctl.book.get(job.id).attempt == 2 and ctl.book.get(job.id).attempt_cpu_s == 0.0
    _reading(ctl, engine, job.id, 3.0)  # the new attempt's counter starts at 0
    assert ctl.book.get(job.id).cpu_used_s == pytest.approx(12.5)
    ctl.flush_held_time(force=True)
    [mine] = by_tenant([], store.held_time("alice"))
    assert mine.cpu_used_hours == pytest.approx(12.5 / 3600)


def test_what_a_job_used_while_the_plane_was_down_is_counted_once() -> None:
    store, engine = MemoryStore(), FakeEngine()
    ctl = _controller(store, engine)
    job = ctl.submit("alice", spec())
    start(ctl, engine, job.id)
    _reading(ctl, engine, job.id, 10.0)
    ctl.book.flush(force=True)
    ctl.flush_held_time(force=True)
    engine.running = {job.id: 1}  # the plane dies; the job's counter goes on to 70
    engine.now += 60
    ctl2 = _controller(store, engine)
    recover(ctl2)
    _reading(ctl2, engine, job.id, 70.0)
    assert ctl2.book.get(job.id).cpu_used_s == pytest.approx(70.0)
    engine.pending.append(JobUsage(job.id, 1, engine.now, 0.0, cpu_s=71.0))  # its last, as it ends
    engine.pending.append(JobExited(job.id, 1, engine.now, 0))
    ctl2.step()
    final = store.get_job(job.id)
    assert final is not None and final.phase == Phase.SUCCEEDED and final.cpu_used_s == pytest.approx(71.0)
    ctl2.flush_held_time(force=True)
    assert sum(h.cpu_used_s for h in store.held_time("alice")) == pytest.approx(71.0)


def test_a_gangs_cpu_is_every_replicas_and_its_rate_rank_zeros() -> None:
    book = GangBook()
    rid = dict(enumerate(r for r, _ in book.open("j", 1, ["n0", "n1", "n2"])))
    out, _ = book.translate(JobUsage(rid[1], 1, 1.0, 2.0, cpu_s=40.0), "n1")
    assert out == []  # only rank 0's samples speak for the job
    book.translate(JobUsage(rid[2], 1, 1.0, 2.0, cpu_s=30.0), "n2")
    book.translate(JobUsage(rid[2], 1, 1.5, 2.0, cpu_s=25.0), "n2")  # a dip never takes back
    [usage], _ = book.translate(JobUsage(rid[0], 1, 2.0, 1.5, cpu_s=10.0), "n0")
    assert usage.job_id == "j" and usage.cpu_cores == 1.5 and usage.cpu_s == pytest.approx(80.0)


def test_a_gangs_replicas_count_on_after_rank_zero_has_exited() -> None:
    # Red team s27: only rank 0's samples were passed on, so what the other replicas used
    # after rank 0's last reading was never counted: a gang whose rank 0 exits at once (code
    # 0: the gang waits for the others) ran its other replicas for hours at ~0 CPU used.
    book = GangBook()
    rid = dict(enumerate(r for r, _ in book.open("j", 1, ["n0", "n1"])))
    book.translate(JobUsage(rid[1], 1, 1.0, 1.0, cpu_s=5.0), "n1")
    [first], _ = book.translate(JobUsage(rid[0], 1, 1.0, 0.0, cpu_s=1.0), "n0")  # rank 0's last reading
    assert first.cpu_s == pytest.approx(6.0)
    assert book.translate(JobExited(rid[0], 1, 1.0, 0), "n0") == ([], [])  # the gang waits for rank 1
    totals = [first.cpu_s]
    for t, used in ((60.0, 500.0), (120.0, 1000.0)):  # rank 1 works on, then its last reading
        out, _ = book.translate(JobUsage(rid[1], 1, t, 8.0, cpu_s=used), "n1")
        assert all(e.job_id == "j" and e.cpu_cores == 0.0 for e in out)  # rank 0's rate: it is gone
        totals += [e.cpu_s for e in out if isinstance(e, JobUsage)]
    [exited], _ = book.translate(JobExited(rid[1], 1, 120.0, 0), "n1")
    assert isinstance(exited, JobExited) and exited.job_id == "j"
    assert max(totals) == pytest.approx(1001.0)
