"""Random valid specs and random engine events thrown at the controller; the invariants of
the job book are checked after every step.

Invariants:
- every phase change in the event log is allowed by the transition table;
- a finished job never changes again, and never runs again;
- restarts never exceed max_restarts, and no attempt is launched twice;
- a job holds an allocation exactly while it is Starting, Running or Stopping;
- what the book shows of a live job is what the store holds (phase, attempt, intent);
- no accepted job is lost;
- every launch, elastic resizes' relaunches included, is within the spec's replica range;
- no job is Starting or Running past its max_runtime_s once a round has run;
- no job array has more than its `parallel` jobs admitted (Queued to Stopping).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluice.control.controller import Controller
from sluice.model import (
    TRANSITIONS,
    Allocation,
    Assignment,
    ClusterView,
    Decision,
    JobCheckpointed,
    JobExited,
    JobProgress,
    JobRecord,
    JobStarted,
    NodeHealth,
    NodeLost,
    NodeUp,
    Phase,
    Resize,
)
from sluice.model.queue import Limits, QueueConfig
from sluice.policy import make_policy
from sluice.spec import parse_job_spec
from sluice.store import MemoryStore, QueueRecord

from .fake_engine import FakeEngine

ADMITTED = (Phase.QUEUED, Phase.STARTING, Phase.RUNNING, Phase.STOPPING)

specs = st.fixed_dictionaries(
    {
        "command": st.just(["python", "train.py"]),
        "resources": st.fixed_dictionaries(
            {"cpu": st.sampled_from([0.25, 0.5, 1, 2, 3])},
            optional={"replicas": st.fixed_dictionaries({"max": st.integers(1, 3)})},
        ),
        "max_restarts": st.integers(0, 3),
        "priority": st.integers(-5, 5),
    },
    optional={
        "qoe": st.fixed_dictionaries({"loss": st.floats(0.01, 1.0)}),
        "max_runtime_s": st.floats(1.0, 60.0),
    },
)


class Pushed:
    """flowcon, plus the decisions a rule pushes for the next round (elastic resizes)."""

    name = "flowcon+pushed"

    def __init__(self) -> None:
        self.base = make_policy("flowcon", interval_s=1.0)
        self.extra: list[Decision] = []

    def decide(self, view: ClusterView) -> list[Decision]:
        out, self.extra = [*self.base.decide(view), *self.extra], []
        return out


class ControllerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.engine = FakeEngine()
        self.policy = Pushed()
        self.ctl = Controller(
            self.store,
            self.engine,
            self.policy,
            checkpoint_root="/c",
            restart_backoff_s=0,
            preempt_min_runtime_s=0.0,
        )
        self.accepted: list[str] = []
        self.finished: dict[str, JobRecord] = {}
        self.cancelled: dict[str, int] = {}
        """job -> its attempt when the user cancelled it: no later attempt may ever start."""

    # ------------------------------------------------------------------ what users do
    @rule(raw=specs)
    def submit(self, raw: dict[str, object]) -> None:
        # Ids chosen here, not random: hypothesis replays a failing run draw for draw.
        self.accepted.append(self.ctl.submit("t", parse_job_spec(raw), job_id=f"j{len(self.accepted)}").id)

    @rule(raw=specs, count=st.integers(1, 4), parallel=st.integers(1, 2))
    def submit_array(self, raw: dict[str, object], count: int, parallel: int) -> None:
        """As the plane makes an array (control/plane.py `_create_array`): one job per index."""
        array_id = f"a{len(self.accepted)}"
        base = parse_job_spec({**raw, "array": {"count": count, "parallel": parallel}})
        assert base.array is not None
        for i in range(count):
            one = base.model_copy(update={"array": base.array.model_copy(update={"id": array_id, "index": i})})
            self.accepted.append(self.ctl.submit("t", one, job_id=f"{array_id}-{i}").id)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if self.accepted:
            jid = data.draw(st.sampled_from(self.accepted))
            job = self.ctl.cancel(jid, "cancelled by t")
            self.cancelled.setdefault(jid, job.attempt)

    @rule(data=st.data(), resume=st.booleans())
    def suspend_or_resume(self, data: st.DataObject, resume: bool) -> None:
        if self.accepted:
            jid = data.draw(st.sampled_from(self.accepted))
            if resume:
                self.ctl.resume(jid, "resumed by t")
            else:
                self.ctl.suspend(jid, "suspended by t")

    @rule(cores=st.one_of(st.none(), st.floats(0.5, 4.0)))
    def admin_sets_the_quota_live(self, cores: float | None) -> None:
        # The default queue's quota changes under running jobs: admission evicts and preempts.
        self.store.save_queue(QueueRecord(QueueConfig("default", None, Limits(cores=cores))))

    @rule(node=st.sampled_from(["n0", "n1"]), health=st.sampled_from([NodeHealth.CORDONED, NodeHealth.HEALTHY]))
    def operator(self, node: str, health: NodeHealth) -> None:
        self.ctl.set_node_health(node, health, "operator", by="operator")

    @rule(data=st.data(), n=st.integers(1, 4))
    def policy_resizes_replicas(self, data: st.DataObject, n: int) -> None:
        job = self._some_live(data)
        if job is not None:
            alloc = Allocation(tuple(Assignment(f"n{k % 2}", 0.25) for k in range(n)))
            self.policy.extra.append(Resize(job.id, alloc, f"to {n} replicas"))

    # ------------------------------------------------------------------ what engines report
    def _some_live(self, data: st.DataObject) -> JobRecord | None:
        live = [j for j in self.ctl.book.live() if j.attempt > 0]
        return data.draw(st.sampled_from(live)) if live else None

    @rule(data=st.data(), stale=st.booleans())
    def started(self, data: st.DataObject, stale: bool) -> None:
        job = self._some_live(data)
        if job is not None:
            self.engine.pending.append(JobStarted(job.id, job.attempt - stale, "n0", self.engine.now))

    @rule(data=st.data(), step=st.integers(0, 1000), loss=st.floats(0, 10))
    def progress(self, data: st.DataObject, step: int, loss: float) -> None:
        job = self._some_live(data)
        if job is not None:
            self.engine.pending.append(JobProgress(job.id, job.attempt, self.engine.now, step, loss))
            self.engine.pending.append(JobCheckpointed(job.id, job.attempt, self.engine.now, step, f"/c/{step}"))

    @rule(data=st.data(), code=st.sampled_from([0, 1, -9, -15]), stale=st.booleans())
    def exited(self, data: st.DataObject, code: int, stale: bool) -> None:
        job = self._some_live(data)
        if job is not None:
            self.engine.pending.append(JobExited(job.id, job.attempt - stale, self.engine.now, code))
            if not stale:
                self.engine.running.pop(job.id, None)

    @rule(node=st.sampled_from(["n0", "n1"]), back=st.booleans())
    def node_churn(self, node: str, back: bool) -> None:
        if back:
            self.engine.pending.append(NodeUp(node, self.engine.now, 2.0))
        else:
            self.engine.pending.append(NodeLost(node, self.engine.now, "heartbeat missed"))

    @rule(dt=st.floats(0.1, 30))
    def round(self, dt: float) -> None:
        self.engine.now += dt
        self.ctl.step()
        for jid in self.accepted:
            job = self.store.get_job(jid)
            if job is not None and job.phase.terminal:
                self.finished.setdefault(jid, job)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def phase_moves_follow_the_table(self) -> None:
        for e in self.store.events(kinds=["phase"]):
            if "from" in e.data:
                assert Phase(e.data["to"]) in TRANSITIONS[Phase(e.data["from"])], e.message

    @invariant()
    def finished_jobs_never_change_or_run_again(self) -> None:
        for jid, done in self.finished.items():
            assert self.store.get_job(jid) == done
            assert self.ctl.book.get(jid) == done
            later = [r for r in self.engine.launched if r.job_id == jid and r.attempt > done.attempt]
            assert not later, f"{jid} ran again after it ended"

    @invariant()
    def a_cancelled_job_never_starts_again(self) -> None:
        for jid, attempt in self.cancelled.items():
            later = [r.attempt for r in self.engine.launched if r.job_id == jid and r.attempt > attempt]
            assert not later, f"{jid} was cancelled at attempt {attempt} and launched again as {later}"
            job = self.store.get_job(jid)
            assert job is not None and job.phase in (Phase.STOPPING, Phase.CANCELLED, Phase.SUCCEEDED, Phase.FAILED)

    @invariant()
    def no_job_runs_on_past_its_time_limit(self) -> None:
        for job in self.ctl.book.live():
            limit = job.spec.max_runtime_s
            if limit is not None and job.phase in (Phase.STARTING, Phase.RUNNING):
                assert job.run_s < limit, (job.id, job.phase, job.run_s, limit)

    @invariant()
    def no_array_has_more_than_parallel_jobs_admitted(self) -> None:
        admitted: dict[str, list[str]] = {}
        for job in self.ctl.book.live():
            a = job.spec.array
            if a is not None and a.id is not None and job.phase in ADMITTED:
                admitted.setdefault(a.id, []).append(job.id)
                assert a.parallel is not None and len(admitted[a.id]) <= a.parallel, (a.id, admitted[a.id])

    @invariant()
    def attempts_and_restarts_are_bounded_and_unique(self) -> None:
        seen: set[tuple[str, int]] = set()
        for r in self.engine.launched:
            assert (r.job_id, r.attempt) not in seen, "an attempt was launched twice"
            seen.add((r.job_id, r.attempt))
        for job in self.store.list_jobs():
            assert job.restarts <= job.spec.max_restarts

    @invariant()
    def launches_stay_in_the_replica_range(self) -> None:
        for r in self.engine.launched:
            rng = r.spec.resources.replicas
            assert rng.min <= r.allocation.replicas <= (rng.max or rng.min), (r.job_id, r.allocation)

    @invariant()
    def allocation_exactly_while_active(self) -> None:
        for job in self.ctl.book.live():
            assert (job.allocation is not None) == job.phase.active, (job.id, job.phase, job.allocation)
            if job.allocation is not None:
                assert isinstance(job.allocation, Allocation)
            assert (job.stop_intent is not None) <= (job.phase == Phase.STOPPING)

    @invariant()
    def book_and_store_agree_and_nothing_is_lost(self) -> None:
        stored = {j.id: j for j in self.store.list_jobs()}
        assert set(self.accepted) <= set(stored)
        for job in self.ctl.book.live():
            s = stored[job.id]
            assert (s.phase, s.attempt, s.stop_intent, s.restarts) == (
                job.phase,
                job.attempt,
                job.stop_intent,
                job.restarts,
            )


ControllerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestController = ControllerMachine.TestCase
