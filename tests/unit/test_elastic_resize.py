"""Elastic resize through the controller (issue 12), against the FakeEngine: a change of
replica count is a checkpointed stop and a relaunch at the new size, recorded with its reason,
never counted as a failure; outside the spec's range, or on an engine that cannot, refused."""

from __future__ import annotations

from dataclasses import replace

from sluice.control.controller import Controller
from sluice.model import Allocation, Assignment, JobExited, JobProgress, JobStarted, Phase, Resize
from sluice.spec import parse_job_spec
from sluice.store import MemoryStore

from .fake_engine import FakeEngine
from .scripted_policy import Scripted


def gang(n: int) -> Allocation:
    return Allocation(tuple(Assignment(f"n{k % 2}", 0.5) for k in range(n)))


def started(replicas_min: int = 2, replicas_max: int = 2) -> tuple[Controller, FakeEngine, Scripted, str]:
    """A running job of `replicas_min` replicas (kube places the spec's min)."""
    engine, pol = FakeEngine(), Scripted()
    ctl = Controller(MemoryStore(), engine, pol, checkpoint_root="/c", restart_backoff_s=0.0)  # type: ignore[arg-type]
    raw = {"command": ["python", "ddp.py"], "resources": {"cpu": 0.5, "replicas": {"min": replicas_min}}}
    raw["resources"]["replicas"]["max"] = replicas_max  # type: ignore[index]
    jid = ctl.submit("t", parse_job_spec(raw)).id
    ctl.step()
    engine.pending.append(JobStarted(jid, 1, "n0", engine.now))
    ctl.step()
    assert ctl.book.get(jid).phase == Phase.RUNNING  # type: ignore[union-attr]
    return ctl, engine, pol, jid


def exit_after_checkpoint(ctl: Controller, engine: FakeEngine, jid: str, step: int) -> None:
    """The job saw SIGTERM, saved at `step` and exited 0, as sdk-using jobs do."""
    attempt = ctl.book.get(jid).attempt  # type: ignore[union-attr]
    engine.now += 3.0
    engine.pending += [
        JobProgress(jid, attempt, engine.now, step, 0.5, {"total_steps": 1000}),
        JobExited(jid, attempt, engine.now, 0),
    ]
    ctl.step()


def test_a_replica_change_stops_through_the_checkpoint_and_relaunches_at_the_new_size() -> None:
    ctl, engine, pol, jid = started(1, 2)
    assert engine.launched[-1].allocation.replicas == 1
    pol.push(Resize(jid, gang(2), "pollux: goodput 1.7x at 2"))
    ctl.step()
    job = ctl.book.get(jid)
    assert job is not None and job.phase == Phase.STOPPING
    assert job.stop_intent is not None and job.stop_intent.target == gang(2)
    assert engine.stopped == [(jid, 1, True)] and engine.resized == []  # asked to checkpoint, not resized live
    exit_after_checkpoint(ctl, engine, jid, 120)
    job = ctl.book.get(jid)
    assert job is not None and job.phase == Phase.STARTING and job.attempt == 2
    assert job.restarts == 0, "a resize is not a failure restart"
    assert job.allocation == gang(2) and engine.launched[-1].allocation == gang(2)
    assert job.reason == "resized 1 → 2 replicas: pollux: goodput 1.7x at 2"
    messages = [e.message for e in ctl.book.events(jid)]
    assert any(m.startswith("attempt 2 on ") and "resized 1 → 2 replicas: pollux" in m for m in messages), messages
    assert any("stopped for resize after 3.0s" in m for m in messages), messages
    assert ctl.decisions.get("Resize") == 1


def test_resizes_both_ways_keep_the_restart_budget() -> None:
    ctl, engine, pol, jid = started(1, 2)
    for attempt, n in ((1, 2), (2, 1), (3, 2)):
        if attempt > 1:
            engine.pending.append(JobStarted(jid, attempt, "n0", engine.now))
            ctl.step()
        pol.push(Resize(jid, gang(n), f"to {n}"))
        ctl.step()
        exit_after_checkpoint(ctl, engine, jid, 100 * attempt)
    job = ctl.book.get(jid)
    assert job is not None and job.attempt == 4 and job.restarts == 0 and job.allocation == gang(2)
    assert [r.allocation.replicas for r in engine.launched] == [1, 2, 1, 2]
    engine.pending += [JobStarted(jid, 4, "n0", engine.now), JobExited(jid, 4, engine.now, 0)]
    ctl.step()
    assert ctl.book.get(jid).phase == Phase.SUCCEEDED  # type: ignore[union-attr]


def test_a_resize_outside_the_spec_range_is_refused_with_the_range() -> None:
    ctl, engine, pol, jid = started(2, 3)
    pol.push(Resize(jid, gang(4), "more"), Resize(jid, gang(1), "less"))
    ctl.step()
    job = ctl.book.get(jid)
    assert job is not None and job.phase == Phase.RUNNING and job.allocation == gang(2)
    assert engine.stopped == [] and ctl.decisions.get("refused") == 2
    refused = [e.message for e in ctl.book.events(jid) if e.kind == "refused"]
    assert "4 replicas is outside the spec's resources.replicas range [2, 3]" in refused[0]
    assert "1 replicas is outside" in refused[1] and "(policy's reason: less)" in refused[1]


def test_an_engine_without_checkpointed_restarts_refuses_a_replica_change() -> None:
    ctl, engine, pol, jid = started(1, 2)
    engine.capabilities = replace(engine.capabilities, migration=False)
    pol.push(Resize(jid, gang(2), "grow"))
    ctl.step()
    assert ctl.book.get(jid).phase == Phase.RUNNING and engine.stopped == []  # type: ignore[union-attr]
    assert "cannot restart a job from its checkpoint" in ctl.book.events(jid)[-1].message


def test_a_job_that_finishes_while_being_resized_succeeds() -> None:
    ctl, engine, pol, jid = started(1, 2)
    pol.push(Resize(jid, gang(2), "grow"))
    ctl.step()
    engine.pending += [
        JobProgress(jid, 1, engine.now, 1000, 0.1, {"total_steps": 1000}),
        JobExited(jid, 1, engine.now, 0),
    ]
    ctl.step()
    job = ctl.book.get(jid)
    assert job is not None and job.phase == Phase.SUCCEEDED and len(engine.launched) == 1


def test_a_same_size_resize_is_still_live() -> None:
    ctl, engine, pol, jid = started(2, 2)
    job = ctl.book.get(jid)
    assert job is not None and job.allocation is not None
    pol.push(Resize(jid, job.allocation.with_cpu_limit(0.5), "trim"))
    ctl.step()
    assert engine.stopped == [] and len(engine.resized) == 1
    assert ctl.book.get(jid).phase == Phase.RUNNING  # type: ignore[union-attr]


def test_the_policy_is_shown_no_more_replicas_than_the_engine_runs() -> None:
    """A spec stored with a `replicas.max` past the engine's limit (submit refuses one now):
    the policy's view caps it there, so no policy grows the job into a resize refused every
    round while the sizes the engine can run go unused."""
    ctl, engine, _, jid = started(1, 2)
    assert ctl.view().jobs[jid].replicas_max == 2
    engine.capabilities = replace(engine.capabilities, max_replicas=1)
    assert ctl.view().jobs[jid].replicas_max == 1
    stored = parse_job_spec(
        {"command": ["python", "ddp.py"], "resources": {"cpu": 0.1, "replicas": {"min": 1, "max": 20}}}
    )
    engine.capabilities = replace(engine.capabilities, max_replicas=8)
    big = ctl.submit("t", stored).id
    ctl.step()  # admitted: in the policy's view
    assert ctl.view().jobs[big].replicas_max == 8
