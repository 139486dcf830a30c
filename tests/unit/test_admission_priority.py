"""Priority preemption in a queue with no quota (the built-in `default`), and priority
classes that never preempt (policy/admission.py, docs/queues.md). Pure values, no I/O."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.model.queue import Amounts, Limits, QueueConfig, WithinQueue
from sluice.policy.admission import AdmissionJob, Evict, Stage, Stall, admit, capacity_preemption_possible

DEFAULT = {"default": QueueConfig("default")}
CLUSTER = Amounts(cores=8, memory_mb=0, gpus=0)


def j(
    jid: str,
    cores: float = 4,
    *,
    stage: Stage = Stage.ACTIVE,
    priority: int = 0,
    since: float | None = 0.0,
    queue: str = "default",
    may_preempt: bool = True,
    preempted: bool = False,
) -> AdmissionJob:
    return AdmissionJob(
        id=jid,
        tenant="t",
        queue=queue,
        priority=priority,
        submitted_at=float(len(jid)),
        demand=Amounts(cores=cores, jobs=1),
        stage=stage,
        running_since=since if stage == Stage.ACTIVE else None,
        preempted=preempted,
        may_preempt=may_preempt,
    )


def evicts(decisions: list) -> list[Evict]:  # type: ignore[type-arg]
    return [d for d in decisions if isinstance(d, Evict)]


def test_a_higher_priority_job_preempts_the_lowest_newest_running_job_of_the_default_queue() -> None:
    jobs = [
        j("low-old", priority=0, since=0.0),
        j("low-new", priority=0, since=50.0),
        j("high", stage=Stage.QUEUED, priority=100),
    ]
    got = evicts(admit(DEFAULT, jobs, capacity=CLUSTER, now=1000.0))
    assert [(e.job_id, e.for_job) for e in got] == [("low-new", "high")]
    assert "priority 100 > 0" in got[0].reason and "no room" in got[0].reason


def test_only_as_many_as_make_it_fit_and_none_when_it_already_fits() -> None:
    jobs = [j("a", 2, priority=0), j("b", 2, priority=1), j("high", 4, stage=Stage.QUEUED, priority=5)]
    assert evicts(admit(DEFAULT, jobs, capacity=CLUSTER, now=1000.0)) == []  # 4 cores are free
    full = [*jobs, j("c", 4, priority=2)]
    assert [e.job_id for e in evicts(admit(DEFAULT, full, capacity=CLUSTER, now=1000.0))] == ["a", "b"]


def test_equal_priorities_never_preempt() -> None:
    jobs = [j("a"), j("b"), j("c", stage=Stage.QUEUED), j("d", stage=Stage.QUEUED)]
    assert not capacity_preemption_possible(jobs)
    assert admit(DEFAULT, jobs, capacity=CLUSTER, now=1000.0) == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([Stage.ACTIVE, Stage.QUEUED, Stage.PENDING]), st.integers(1, 8)), max_size=12)
)
def test_with_one_priority_admission_decides_as_if_capacity_preemption_did_not_exist(
    spec: list[tuple[Stage, int]],
) -> None:
    jobs = [j(f"j{i}", cores, stage=stage) for i, (stage, cores) in enumerate(spec)]
    assert not evicts(admit(DEFAULT, jobs, capacity=CLUSTER, now=1000.0))


def test_within_queue_never_and_non_preempting_classes_wait() -> None:
    jobs = [j("low", 8), j("high", 8, stage=Stage.QUEUED, priority=9)]
    never = {"default": QueueConfig("default", within_queue=WithinQueue.NEVER)}
    assert evicts(admit(never, jobs, capacity=CLUSTER, now=1000.0)) == []
    polite = [jobs[0], replace(jobs[1], may_preempt=False)]
    assert evicts(admit(DEFAULT, polite, capacity=CLUSTER, now=1000.0)) == []


def test_a_job_that_may_not_preempt_says_why_it_waits() -> None:
    jobs = [j("low", 8), j("high", 8, stage=Stage.QUEUED, priority=9, may_preempt=False)]
    assert capacity_preemption_possible(jobs)  # the controller asks admission, so the reason is said
    got = admit(DEFAULT, jobs, capacity=CLUSTER, now=1000.0)
    assert got == [
        Stall(
            "high",
            "its priority class does not preempt (preemption: never): it waits for room rather than "
            "preempting 1 lower-priority job(s) of queue default",
        )
    ]
    never = {"default": QueueConfig("default", within_queue=WithinQueue.NEVER)}
    got = admit(never, [jobs[0], replace(jobs[1], may_preempt=True)], capacity=CLUSTER, now=1000.0)
    assert [type(d) for d in got] == [Stall] and "queue default does not preempt for it (within_queue=never)" in (
        got[0].reason
    )
    # Nothing to say when preempting would not have made room either.
    big = [j("low", 4), j("high", 16, stage=Stage.QUEUED, priority=9, may_preempt=False)]
    assert admit(DEFAULT, big, capacity=CLUSTER, now=1000.0) == []


def test_young_jobs_are_not_preempted_and_stopping_victims_are_waited_for() -> None:
    young = [j("low", 8, since=990.0), j("high", 8, stage=Stage.QUEUED, priority=9)]
    assert evicts(admit(DEFAULT, young, capacity=CLUSTER, now=1000.0, preempt_min_runtime_s=60)) == []
    going = [
        j("low", 8, stage=Stage.STOPPING, preempted=True),
        j("other", 4, priority=-1),
        j("high", 8, stage=Stage.QUEUED, priority=9),
    ]
    assert evicts(admit(DEFAULT, going, capacity=Amounts(cores=12), now=1000.0)) == []


def test_queues_with_a_quota_and_other_queues_jobs_are_left_to_quota_preemption() -> None:
    queues = {**DEFAULT, "ml": QueueConfig("ml", nominal=Limits(cores=8))}
    jobs = [j("ml-low", 8, queue="ml"), j("ml-high", 8, stage=Stage.QUEUED, priority=9, queue="ml")]
    assert evicts(admit(queues, jobs, capacity=CLUSTER, now=1000.0)) == []
    other = [j("ml-low", 8, queue="ml"), j("high", 8, stage=Stage.QUEUED, priority=9)]
    assert evicts(admit(queues, other, capacity=CLUSTER, now=1000.0)) == []


def test_a_non_preempting_class_does_not_preempt_lower_priority_jobs_of_its_quota_queue() -> None:
    queues = {"ml": QueueConfig("ml", nominal=Limits(cores=8))}
    jobs = [j("low", 8, queue="ml"), j("high", 8, stage=Stage.PENDING, priority=9, queue="ml", may_preempt=False)]
    decisions = admit(queues, jobs, capacity=CLUSTER, now=1000.0)
    assert evicts(decisions) == [] and "does not preempt" in decisions[0].reason
    preempting = [jobs[0], replace(jobs[1], may_preempt=True)]
    assert [e.job_id for e in evicts(admit(queues, preempting, capacity=CLUSTER, now=1000.0))] == ["low"]


def test_a_job_held_back_only_by_the_rate_limit_says_so() -> None:
    # docs/queues.md: "a job that waits because of it says so". In the default queue the
    # high-priority job read only "insufficient resources ..." for its first minute.
    jobs = [j("low", 8, since=990.0), j("high", 4, stage=Stage.QUEUED, priority=9)]
    got = admit(DEFAULT, jobs, capacity=CLUSTER, now=1000.0, preempt_min_runtime_s=60.0)
    assert got == [
        Stall(
            "high",
            "1 lower-priority job(s) of queue default that would make room ran less than 60s (no thrashing): "
            "it preempts them once they have",
        )
    ]
    assert [e.job_id for e in evicts(admit(DEFAULT, jobs, capacity=CLUSTER, now=1051.0))] == ["low"]
    # Nothing said when the young jobs would not make room either, or when an old one does.
    big = [j("low", 4, since=990.0), j("high", 16, stage=Stage.QUEUED, priority=9)]
    assert admit(DEFAULT, big, capacity=CLUSTER, now=1000.0) == []
    mixed = [j("young", 4, since=990.0), j("old", 4, since=0.0), j("high", 4, stage=Stage.QUEUED, priority=9)]
    assert [e.job_id for e in evicts(admit(DEFAULT, mixed, capacity=CLUSTER, now=1000.0))] == ["old"]
