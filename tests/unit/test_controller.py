"""The controller's round, exit handling, retries, preemption, migration and recovery,
against a FakeEngine (no processes; see fake_engine.py)."""

from __future__ import annotations

import pytest

from sluice.control.controller import Controller
from sluice.control.recovery import recover
from sluice.model import (
    Allocation,
    ClusterView,
    Decision,
    JobCheckpointed,
    JobExited,
    JobProgress,
    JobStarted,
    Migrate,
    NodeHealth,
    NodeLost,
    NodeUp,
    OomKill,
    Phase,
    Preempt,
)
from sluice.policy import make_policy
from sluice.spec import parse_job_spec
from sluice.store import MemoryStore

from .fake_engine import FakeEngine
from .scripted_policy import Scripted


def spec(**kw: object):
    return parse_job_spec({"command": ["python", "train.py"], "resources": {"cpu": 1}, **kw})


@pytest.fixture
def setup() -> tuple[Controller, FakeEngine, MemoryStore]:
    store, engine = MemoryStore(), FakeEngine()
    ctl = Controller(store, engine, Scripted(), checkpoint_root="/ckpt", restart_backoff_s=2.0)
    return ctl, engine, store


def push(ctl: Controller, *ds: Decision) -> None:
    """Have the policy return `ds` in the next round, and run it."""
    pol = ctl.policy
    assert isinstance(pol, Scripted)
    pol.push(*ds)
    ctl.step()


def start(ctl: Controller, engine: FakeEngine, job_id: str) -> int:
    ctl.step()
    attempt = ctl.book.get(job_id).attempt
    engine.pending.append(JobStarted(job_id, attempt, "n0", engine.now, pid=42))
    ctl.step()
    return attempt


def test_submit_place_run_succeed(setup) -> None:
    ctl, engine, store = setup
    job = ctl.submit("t", spec())
    assert store.get_job(job.id).phase == Phase.PENDING  # durable before anything runs
    start(ctl, engine, job.id)
    assert ctl.book.get(job.id).phase == Phase.RUNNING
    req = engine.launched[0]
    assert req.checkpoint_dir == f"/ckpt/{job.id}/checkpoints"
    assert req.allocation.assignments[0].cpu_limit is None  # kube: shares only
    engine.pending.append(JobExited(job.id, 1, engine.now, 0))
    ctl.step()
    assert store.get_job(job.id).phase == Phase.SUCCEEDED
    kinds = [e.kind for e in store.events(job_id=job.id)]
    assert "place" in kinds and kinds.count("phase") >= 4


def test_stale_attempt_events_are_ignored(setup) -> None:
    ctl, engine, _ = setup
    job = ctl.submit("t", spec())
    start(ctl, engine, job.id)
    engine.pending.append(JobExited(job.id, 0, engine.now, 1))  # attempt 0 never existed
    engine.pending.append(JobProgress(job.id, 7, engine.now, 5, 0.1))
    ctl.step()
    assert ctl.book.get(job.id).phase == Phase.RUNNING and ctl.book.get(job.id).step == 0


def test_crash_is_retried_with_backoff_then_fails(setup) -> None:
    ctl, engine, store = setup
    job = ctl.submit("t", spec(max_restarts=2))
    for n in range(1, 4):
        attempt = start(ctl, engine, job.id)
        assert attempt == n
        engine.pending.append(JobExited(job.id, attempt, engine.now, 3))
        ctl.step()
        if n <= 2:
            rec = ctl.book.get(job.id)
            assert rec.phase == Phase.QUEUED and rec.restarts == n
            assert rec.not_before == engine.now + 2.0 * 2 ** (n - 1)
            ctl.step()
            assert len(engine.launched) == n  # still backing off: not relaunched
            assert "back-off" in rec.reason
            engine.now = rec.not_before
    final = store.get_job(job.id)
    assert final.phase == Phase.FAILED and "exit code 3" in final.reason and "2 restart" in final.reason


def test_preempt_requeues_and_resumes(setup) -> None:
    ctl, engine, _ = setup
    job = ctl.submit("t", spec())
    start(ctl, engine, job.id)
    push(ctl, Preempt(job.id, "make room"))
    assert ctl.book.get(job.id).phase == Phase.STOPPING and engine.stopped == [(job.id, 1, True)]
    engine.pending.append(JobCheckpointed(job.id, 1, engine.now, 10, "/ckpt/x"))
    engine.pending.append(JobExited(job.id, 1, engine.now + 1, 0))
    ctl.step()  # exit 0 after a stop request without finishing = checkpointed, requeued and placed again
    assert ctl.book.get(job.id).attempt == 2 and ctl.book.get(job.id).phase == Phase.STARTING
    assert ctl.book.get(job.id).checkpoint == "/ckpt/x"


def test_migrate_relaunches_on_target(setup) -> None:
    ctl, engine, _ = setup
    job = ctl.submit("t", spec())
    start(ctl, engine, job.id)
    target = Allocation.single("n1", 1.0)
    push(ctl, Migrate(job.id, target, "speculative"))
    engine.now += 3
    engine.pending.append(JobExited(job.id, 1, engine.now, 0))
    ctl.step()
    assert engine.launched[-1].allocation == target and engine.launched[-1].attempt == 2
    assert ctl.book.get(job.id).last_stop_s == pytest.approx(3.0)


def test_cancel_running_job(setup) -> None:
    ctl, engine, store = setup
    job = ctl.submit("t", spec())
    start(ctl, engine, job.id)
    ctl.cancel(job.id)
    engine.pending.append(JobExited(job.id, 1, engine.now, -15))
    ctl.step()
    assert store.get_job(job.id).phase == Phase.CANCELLED


def test_wait_reason_when_nothing_fits(setup) -> None:
    ctl, _engine, store = setup
    job = ctl.submit("t", spec(resources={"cpu": 8}))
    ctl.step()
    assert ctl.book.get(job.id).phase == Phase.QUEUED
    assert ctl.book.get(job.id).reason.startswith("Unschedulable: one replica needs 8 CPU")
    ctl.step()
    waits = [e for e in store.events(job_id=job.id) if e.kind == "wait"]
    assert len(waits) == 1  # the same reason is not logged every round


def test_node_lost_requeues_its_jobs(setup) -> None:
    ctl, engine, _ = setup
    job = ctl.submit("t", spec())
    start(ctl, engine, job.id)
    node = ctl.book.get(job.id).allocation.primary_node
    engine.pending.append(NodeLost(node, engine.now, "raylet died"))
    engine.node_infos = [n for n in engine.node_infos if n.name != node]
    ctl.step()
    rec = ctl.book.get(job.id)
    assert rec.attempt == 2 and rec.allocation.primary_node != node and rec.restarts == 0


def test_cordon_moves_jobs_off(setup) -> None:
    ctl, engine, _ = setup
    a = ctl.submit("t", spec())
    start(ctl, engine, a.id)
    node = ctl.book.get(a.id).allocation.primary_node
    ctl.set_node_health(node, NodeHealth.CORDONED, "cpu_iowait high")
    assert ctl.book.get(a.id).phase == Phase.STOPPING
    engine.pending.append(JobExited(a.id, 1, engine.now, 0))
    ctl.step()
    assert ctl.book.get(a.id).allocation.primary_node != node


def test_a_cordoned_node_that_is_lost_and_comes_back_is_still_cordoned(setup) -> None:
    # Walkthrough s30: `sluice node cordon w2`, w2's raylet died, `ray start` brought it back
    # under its `sluice.node` label: it came back Healthy ("node came back") and got work
    # again, though docs/ray.md says a machine that comes back keeps its cordon.
    ctl, engine, _store = setup
    node = engine.node_infos[0]
    ctl.step()
    ctl.set_node_health(node.name, NodeHealth.CORDONED, "disk", by="operator")
    engine.pending.append(NodeLost(node.name, engine.now, "raylet died"))
    ctl.step()
    assert ctl.node(node.name).health == NodeHealth.LOST
    engine.pending.append(NodeUp(node.name, engine.now, node.cpu, node.gpus, node.memory_mb, dict(node.labels)))
    ctl.step()
    back = ctl.node(node.name)
    assert (back.health, back.reason) == (NodeHealth.CORDONED, "disk")
    # uncordoned meanwhile (or never cordoned): it comes back Healthy
    ctl.set_node_health(node.name, NodeHealth.HEALTHY, "uncordoned by operator", by="operator")
    engine.pending.append(NodeLost(node.name, engine.now, "raylet died"))
    ctl.step()
    engine.pending.append(NodeUp(node.name, engine.now, node.cpu, node.gpus, node.memory_mb, dict(node.labels)))
    ctl.step()
    assert ctl.node(node.name).health == NodeHealth.HEALTHY


def test_recovery_adopts_requeues_and_kills_strays() -> None:
    store, engine = MemoryStore(), FakeEngine()
    ctl = Controller(store, engine, make_policy("kube"), checkpoint_root="/c")
    running = ctl.submit("t", spec())
    gone = ctl.submit("t", spec())
    queued = ctl.submit("t", spec(resources={"cpu": 8}))
    ctl.step()
    # the control plane "dies" here; a stray process of an old attempt exists too
    engine.running = {running.id: 1, "j-unknown": 3}
    engine.running.pop(gone.id, None)
    ctl2 = Controller(store, engine, make_policy("kube"), checkpoint_root="/c")
    report = recover(ctl2)
    assert report.adopted == [running.id]
    assert report.requeued == [gone.id]
    assert queued.id in report.queued
    assert ("j-unknown", 3, False) in engine.stopped
    assert ctl2.book.get(running.id).phase == Phase.RUNNING
    ctl2.step()
    assert ctl2.book.get(gone.id).attempt == 2  # relaunched exactly once
    assert sum(1 for r in engine.launched if r.job_id == running.id) == 1


class _Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.views: list[ClusterView] = []

    def decide(self, view: ClusterView) -> list[Decision]:
        self.views.append(view)
        return []


def test_view_carries_progress_signals() -> None:
    store, engine, pol = MemoryStore(), FakeEngine(), _Recorder()
    ctl = Controller(store, engine, pol, checkpoint_root="/c")
    job = ctl.submit("t", spec())
    ctl.step()
    for i in range(5):
        engine.pending.append(JobProgress(job.id, 0, engine.now + i, i * 10, 1.0 / (i + 1), {"total_steps": 100}))
    ctl.step()
    pr = pol.views[-1].jobs[job.id].progress
    assert pr.step == 40 and pr.total_steps == 100 and pr.throughput == pytest.approx(10.0)
    assert pr.predicted_remaining_s == pytest.approx(6.0)


def test_an_oom_kill_is_a_typed_failure_retried_then_failed(setup) -> None:
    ctl, engine, store = setup
    job = ctl.submit("t", spec(max_restarts=1, resources={"cpu": 1, "memory_mb": 256}))
    oom = OomKill(256, 256 * 1024 * 1024)
    for expected in (1, 2):
        attempt = start(ctl, engine, job.id)
        assert attempt == expected
        engine.pending.append(JobExited(job.id, attempt, engine.now, -9, "killed by signal 9", oom=oom))
        ctl.step()
        engine.now = ctl.book.get(job.id).not_before
    final = store.get_job(job.id)
    assert final.phase == Phase.FAILED and final.restarts == 1
    assert final.reason.startswith("OOMKilled: exceeded memory limit 256 MiB (peak 256 MiB); exit code -9")
    assert "gave up after 1 restart" in final.reason
    assert any("OOMKilled" in e.message and "retry 1/1" in e.message for e in store.events(job_id=job.id))


def test_a_gangs_running_reason_names_every_node_its_replicas_started_on() -> None:
    """The start event of a gang comes from rank 0's node, and the reason named that node
    alone ("process started on h0") for replicas on three (Ray walk s30)."""
    from dataclasses import replace

    from sluice.control.controller import _started_where
    from sluice.model import Allocation, Assignment, JobRecord

    one = JobRecord(id="j-1", tenant="t", spec=spec(), allocation=Allocation.single("n0"))
    assert _started_where(one, JobStarted("j-1", 1, "n0", 0.0, pid=42)) == "process started on n0 (pid 42)"
    gang = replace(one, allocation=Allocation(tuple(Assignment(n) for n in ("h0", "w1", "w1"))))
    assert (
        _started_where(gang, JobStarted("j-1", 1, "h0", 0.0, pid=42)) == "3 replicas started on h0, w1 (rank 0: pid 42)"
    )
    assert _started_where(gang, JobStarted("j-1", 1, "h0", 0.0)) == "3 replicas started on h0, w1"
