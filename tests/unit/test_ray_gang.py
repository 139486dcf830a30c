"""Pure parts of the Ray engine: replica bookkeeping (gangs) and Ray membership diffs."""

from __future__ import annotations

import pytest

from sluice.engine import ray_gang
from sluice.engine.ray_gang import GangBook, parse_replica, replica_id
from sluice.engine.ray_membership import NAME_LABEL, Membership, live_nodes
from sluice.model import JobExited, JobProgress, JobStarted, NodeKPIs, NodeLost, NodeUp, OomKill


def raw(node_id: str, alive: bool = True, cpu: float = 1.0, name: str | None = None) -> dict[str, object]:
    labels = {"ray.io/node-id": node_id}
    if name:
        labels[NAME_LABEL] = name
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": "10.0.0.1",
        "Resources": {"CPU": cpu, "memory": 2 * 1024**3},
        "Labels": labels,
    }


def test_replica_ids_round_trip_and_single_replica_keeps_the_job_id() -> None:
    assert replica_id("j-1", 0, 1) == "j-1"
    assert parse_replica("j-1") == ("j-1", 0, 1)
    rid = replica_id("j--x", 2, 3)
    assert parse_replica(rid) == ("j--x", 2, 3)


def test_gang_starts_when_all_replicas_started_and_reports_rank0_progress_only() -> None:
    book = GangBook()
    reps = book.open("j", 1, ["a", "b"])
    (r0, _), (r1, _) = reps
    out, _ = book.translate(JobStarted(r1, 1, "b", 1.0, pid=7), "b")
    assert out == []
    out, _ = book.translate(JobStarted(r0, 1, "a", 2.0, pid=5), "a")
    assert out == [JobStarted("j", 1, "a", 2.0, 5)]
    assert book.translate(JobProgress(r1, 1, 3.0, 10, 0.5), "b")[0] == []
    assert book.translate(JobProgress(r0, 1, 3.0, 10, 0.5), "a")[0] == [JobProgress("j", 1, 3.0, 10, 0.5)]


def test_first_failing_replica_takes_the_gang_down_and_the_job_exits_once() -> None:
    book = GangBook()
    (r0, _), (r1, _), (r2, _) = book.open("j", 4, ["a", "b", "c"])
    out, stops = book.translate(JobExited(r1, 4, 1.0, 3, "boom"), "b")
    assert out == []
    assert sorted(stops) == [("a", r0, 4), ("c", r2, 4)]
    assert book.translate(JobExited(r0, 4, 2.0, -9), "a")[0] == []
    out, stops = book.translate(JobExited(r2, 4, 3.0, -9), "c")
    assert [(e.job_id, e.exit_code, e.reason) for e in out if isinstance(e, JobExited)] == [("j", 3, "boom")]
    assert stops == []


def test_closed_gangs_are_kept_to_a_bound_and_a_late_event_of_one_dropped_is_harmless(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One gang a job attempt, never dropped, grew without end on a plane running gangs for
    months; the newest KEEP_CLOSED closed ones are kept, open ones always."""
    monkeypatch.setattr(ray_gang, "KEEP_CLOSED", 3)
    book = GangBook()
    running = book.open("live", 1, ["a", "b"])
    for attempt in range(1, 8):
        (r0, _), (r1, _) = book.open("j", attempt, ["a", "b"])
        book.translate(JobExited(r0, attempt, 1.0, 0), "a")
        [done], _ = book.translate(JobExited(r1, attempt, 1.0, 0), "b")
        assert isinstance(done, JobExited) and done.attempt == attempt
    assert sorted(k for k in book._gangs) == [("j", 5), ("j", 6), ("j", 7), ("live", 1)]
    assert [g.job_id for g in book.active()] == ["live"] and book.replicas("live", 1) == running
    # a replica's late exit of a gang dropped long ago tells the controller nothing new
    late, _ = book.translate(JobExited(replica_id("j", 0, 2), 1, 9.0, 0), "a")
    assert late == []


def test_a_forgotten_job_leaves_no_rank0_entry() -> None:
    """Every launch (a job of one replica too) books its rank 0 for the job's log and node: one
    entry a job ever run, kept for good. Retention and `job delete` forget the job's entry."""
    book = GangBook()
    book.open("j1", 1, ["a"])
    book.open("g", 1, ["a", "b"])
    book.adopt(replica_id("g", 0, 2), 2, "b")
    assert set(book.rank0) == {"j1", "g"}
    book.forget("g")
    book.forget("never-launched")
    assert set(book.rank0) == {"j1"}


def test_an_oom_killed_replica_makes_the_gang_exit_as_oom_killed() -> None:
    book = GangBook()
    (r0, _), (r1, _) = book.open("j", 1, ["a", "b"])
    oom = OomKill(limit_mb=64, peak_bytes=64 << 20)
    book.translate(JobExited(r1, 1, 1.0, -9, "OOMKilled", oom=oom), "b")
    out, _ = book.translate(JobExited(r0, 1, 2.0, -15), "a")
    assert [(e.exit_code, e.oom) for e in out if isinstance(e, JobExited)] == [(-9, oom)]


def test_a_replica_that_could_never_start_makes_the_gang_exit_not_retryable() -> None:
    book = GangBook()
    (r0, _), (r1, _) = book.open("j", 1, ["a", "b"])
    book.translate(JobExited(r1, 1, 1.0, 127, "launch failed: cannot use /root/python3", retryable=False), "b")
    out, _ = book.translate(JobExited(r0, 1, 2.0, -15), "a")  # killed after: not what the gang exits with
    assert [(e.exit_code, e.retryable) for e in out if isinstance(e, JobExited)] == [(127, False)]
    (s0, _), (s1, _) = book.open("k", 1, ["a", "b"])
    book.translate(JobExited(s1, 1, 1.0, 3, "boom"), "b")
    out, _ = book.translate(JobExited(s0, 1, 2.0, -15), "a")
    assert [e.retryable for e in out if isinstance(e, JobExited)] == [True]


def test_node_loss_exits_the_jobs_on_it_as_node_lost_and_kills_their_other_replicas() -> None:
    book = GangBook()
    book.open("solo", 1, ["a"])
    (g0, _), (_g1, _) = book.open("gang", 2, ["b", "a"])
    book.open("elsewhere", 1, ["c"])
    out, stops = book.node_lost("a", 9.0)
    exits = {e.job_id: e for e in out if isinstance(e, JobExited)}
    assert set(exits) == {"solo", "gang"}
    assert all(e.reason == "node lost: a" and e.exit_code == -9 and e.node_lost for e in exits.values())
    assert stops == [("b", g0, 2)]
    # the killed replica's later exit does not exit the job a second time
    assert book.translate(JobExited(g0, 2, 10.0, -9), "b")[0] == []


def test_adopted_replicas_rebuild_the_gang() -> None:
    book = GangBook()
    rid0, rid1 = replica_id("j", 0, 2), replica_id("j", 1, 2)
    assert book.adopt(rid0, 3, "a") == "j"
    book.adopt(rid1, 3, "b")
    assert book.replicas("j", 3) == [(rid0, "a"), (rid1, "b")]
    assert book.rank0["j"] == (rid0, "a")


def test_node_events_pass_through() -> None:
    e = NodeKPIs("a", 1.0, {"cpu": 0.5})
    assert GangBook().translate(e, "a") == ([e], [])


def test_membership_reports_joins_losses_and_restarts_under_a_stable_label_name() -> None:
    m = Membership()
    ups = m.update([raw("aaa", name="n1"), raw("bbb"), raw("ccc", alive=False)], 1.0)
    assert {e.node for e in ups if isinstance(e, NodeUp)} == {"n1", "ray-bbb"}
    assert m.update([raw("aaa", name="n1"), raw("bbb")], 2.0) == []
    out = m.update([raw("bbb"), raw("aaa", alive=False, name="n1")], 3.0)
    assert [type(e) for e in out] == [NodeLost] and out[0].node == "n1"
    out = m.update([raw("bbb"), raw("ddd", name="n1")], 4.0)
    assert [(type(e), e.node) for e in out] == [(NodeUp, "n1")]
    # the same name on a new raylet without a gap in between is a loss and a join
    out = m.update([raw("bbb"), raw("eee", name="n1")], 5.0)
    assert [(type(e), e.node) for e in out] == [(NodeLost, "n1"), (NodeUp, "n1")]


def test_a_second_live_node_with_a_taken_name_is_left_out_not_taken_for_a_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Walkthrough s30: `ray start --labels='{"sluice.node": "w1"}'` on a second machine while w1
    # ran was read as w1 restarting: NodeLost("the Ray node restarted") requeued w1's jobs to run
    # again elsewhere while they still ran on w1, whose raylet lived on.
    m = Membership()
    m.update([raw("aaa", name="w1"), raw("bbb", name="w2")], 1.0)
    with caplog.at_level("WARNING", logger="sluice.engine.ray"):
        assert m.update([raw("aaa", name="w1"), raw("ccc", name="w1"), raw("bbb", name="w2")], 2.0) == []
        assert m.update([raw("aaa", name="w1"), raw("ccc", name="w1"), raw("bbb", name="w2")], 3.0) == []
    assert m.nodes["w1"].node_id == "aaa"
    assert caplog.text.count("Ray node ccc") == 1 and "labelled sluice.node=w1 like live node aaa" in caplog.text
    # once w1's first raylet is gone, the other takes the name: a loss and a join
    out = m.update([raw("ccc", name="w1"), raw("bbb", name="w2")], 4.0)
    assert [(type(e), e.node) for e in out] == [(NodeLost, "w1"), (NodeUp, "w1")]
    assert m.nodes["w1"].node_id == "ccc"
    # a plane starting with both there keeps the first Ray lists
    fresh = Membership()
    fresh.update([raw("ccc", name="w1"), raw("aaa", name="w1")], 1.0)
    assert fresh.nodes["w1"].node_id == "ccc"


def test_live_nodes_reads_resources() -> None:
    nodes = live_nodes([raw("abcdef0123456789", cpu=3.0)])
    (node,) = nodes.values()
    assert node.name == "ray-abcdef012345" and node.cpu == 3.0 and node.memory_mb == 2048
