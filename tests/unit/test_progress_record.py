"""A job's progress.jsonl is written by the job's own uid: every record is untrusted input.
One record with a step past 64 bits used to fail the control plane's every round (the store
refused it), and `1e400` (inf in JSON) raised inside the agent's poll."""

from __future__ import annotations

import json
from pathlib import Path

from sluice.agent import tail
from sluice.agent.progress_record import MAX_METRICS, progress_event, step_of
from sluice.agent.tail import JsonlTail
from sluice.model import JobCheckpointed, JobProgress
from sluice.model.progress import MAX_STEP, ProgressTracker


def event(line: str) -> JobProgress | JobCheckpointed | None:
    return progress_event("j", 1, json.loads(line), lambda: 42.0)


def test_a_step_is_an_integer_within_bounds() -> None:
    assert [step_of(v) for v in (0, 5, 5.0, MAX_STEP)] == [0, 5, 5, MAX_STEP]
    for bad in (2**70, MAX_STEP + 1, -3, 1.5, float("inf"), float("nan"), True, "5", None, [1]):
        assert step_of(bad) is None, bad


def test_records_a_job_may_not_send_are_dropped() -> None:
    for line in (
        '{"t": 1, "step": 1e400}',
        f'{{"t": 1, "step": {2**70}}}',
        '{"t": 1, "step": -3}',
        '{"t": 1, "step": "7"}',
        '{"t": 1, "step": 2, "checkpoint": 5}',
        '{"t": 1, "step": 2, "checkpoint": ""}',
    ):
        assert event(line) is None, line


def test_bad_fields_are_dropped_and_the_rest_kept() -> None:
    e = event('{"t": 1e400, "step": 3, "loss": 1e400, "metrics": {"total_steps": 1e400, "acc": 0.5, "b": true}}')
    assert isinstance(e, JobProgress)
    assert (e.time, e.step, e.loss, e.metrics) == (42.0, 3, None, {"acc": 0.5})
    many = {f"m{i}": i for i in range(MAX_METRICS + 10)} | {"x" * 300: 1}
    e = event(json.dumps({"t": 5, "step": 1, "metrics": many}))
    assert isinstance(e, JobProgress) and len(e.metrics) == MAX_METRICS and "x" * 300 not in e.metrics
    c = event('{"t": 5, "step": 4, "checkpoint": "ckpt-4.pt"}')
    assert c == JobCheckpointed("j", 1, 5.0, 4, "ckpt-4.pt")


def test_the_tail_survives_a_deeply_nested_line_and_a_line_longer_than_a_chunk(
    tmp_path: Path, monkeypatch: object
) -> None:
    path = tmp_path / "progress.jsonl"
    path.write_bytes(b"[" * 100_000 + b"\n" + b'{"step": 1}\n')
    t = JsonlTail(path)
    assert t.read() == [{"step": 1}]
    tail.MAX_CHUNK, old = 64, tail.MAX_CHUNK
    try:
        with open(path, "ab") as f:
            f.write(b"x" * 200 + b'\n{"step": 2}\n')
        got: list[dict[str, int]] = []
        for _ in range(6):  # the long line is skipped a chunk at a time, never read for ever
            got += t.read()
        assert got == [{"step": 2}]
    finally:
        tail.MAX_CHUNK = old


def test_the_tracker_ignores_a_total_it_cannot_hold() -> None:
    tr = ProgressTracker()
    tr.report(1.0, 1, 0.5, {"total_steps": float("inf")})
    tr.report(2.0, 2, 0.5, {"total_steps": float(2**70)})
    assert tr.total_steps is None
    tr.report(3.0, 3, 0.5, {"total_steps": 100.0})
    assert tr.total_steps == 100


def test_losses_a_float_can_hold_but_a_fit_cannot_do_not_fail_the_job() -> None:
    """A job with a loss target reporting 1e308 and 1e-300 by turns made the convergence fit
    overflow, and the job was failed with an internal error; it has no prediction instead."""
    from sluice.model.progress import predict_steps_to_loss

    points = [(k, 1e308 if k % 2 else 1e-300) for k in range(1, 12)]
    assert predict_steps_to_loss(points, 0.0) is None
    tr = ProgressTracker()
    tr.loss_target = 0.0
    for k, v in points:
        tr.report(float(k), k, v)
    tr.snapshot()  # no raise


def test_a_flood_of_records_becomes_a_bounded_number_of_events_ending_with_the_newest() -> None:
    from sluice.agent.progress_record import MAX_PER_POLL, thin

    flood = [JobProgress("j", 1, float(k), k, 0.5, {}) for k in range(10_000)]
    flood.insert(5000, JobCheckpointed("j", 1, 5000.0, 5000, "ckpt-5000.pt"))
    kept = thin(flood)
    progress = [e for e in kept if isinstance(e, JobProgress)]
    assert len(progress) == MAX_PER_POLL and progress[-1].step == 9999 and progress[0].step == 0
    assert [e.step for e in progress] == sorted(e.step for e in progress)
    assert any(isinstance(e, JobCheckpointed) for e in kept)
    few = flood[:10]
    assert thin(few) == few
