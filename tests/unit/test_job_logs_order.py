"""A moved job's logs in attempt order (api/job_logs.py by_attempt, attempt_start).

On Ray each node keeps its own log of a job; a job that ran on node A, then B, then A again
has attempts 1 and 3 in A's log and attempt 2 in B's. Read whole, oldest write first, the
user saw 2, 1, 3; the agents' index (where each attempt starts in a log) cuts A's log there."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.api import job_logs
from sluice.model.runfolder import JOB_LOG_INDEX


def _log(folder: Path, attempts: list[tuple[int, str]], index: bool = True) -> Path:
    """A node's log holding `attempts` (number, output), with the agent's index beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    path, data, lines = folder / "job.log", b"", []
    for attempt, out in attempts:
        lines.append(f"{attempt} {len(data)}\n")
        data += f"===== sluice: attempt {attempt} =====\n{out}".encode()
    path.write_bytes(data)
    if index:
        (folder / JOB_LOG_INDEX).write_text("".join(lines))
    return path


def _read(parts: list[job_logs.Segment]) -> str:
    return b"".join(job_logs.pieces(parts)).decode()


def test_a_job_back_on_a_node_reads_in_attempt_order(tmp_path: Path) -> None:
    b = _log(tmp_path / "b", [(2, "two\n")])
    a = _log(tmp_path / "a", [(1, "one\n"), (3, "three\n")])
    text = _read(job_logs.by_attempt([b, a]))  # B's log was written last but one: first
    assert text == "===== sluice: attempt 1 =====\none\n===== sluice: attempt 2 =====\ntwo\n" + (
        "===== sluice: attempt 3 =====\nthree\n"
    )
    # with a tail: the last lines of them all, in that order
    assert _read(job_logs.segments(job_logs.by_attempt([b, a]), 3)) == "two\n===== sluice: attempt 3 =====\nthree\n"
    # with a byte budget: the newest bytes
    assert _read(job_logs.segments(job_logs.by_attempt([b, a]), None, budget=6)) == "three\n"


def test_an_attempt_cut_off_mid_line_is_owed_a_line_break(tmp_path: Path) -> None:
    b = _log(tmp_path / "b", [(2, "two, killed mid-li")])
    a = _log(tmp_path / "a", [(1, "one, killed mid-li"), (3, "three")])
    text = _read(job_logs.by_attempt([b, a]))
    assert text.splitlines() == [
        "===== sluice: attempt 1 =====",
        "one, killed mid-li",
        "===== sluice: attempt 2 =====",
        "two, killed mid-li",
        "===== sluice: attempt 3 =====",
        "three",
    ]
    assert not text.endswith("\n")  # the newest attempt's partial line goes on as it is


def test_logs_without_an_index_keep_the_order_given(tmp_path: Path) -> None:
    b = _log(tmp_path / "b", [(2, "two\n")], index=False)
    a = _log(tmp_path / "a", [(1, "one\n"), (3, "three\n")])
    assert _read(job_logs.by_attempt([b, a])) == b.read_text() + a.read_text()
    one = _log(tmp_path / "one", [(1, "x\n"), (2, "y\n")])
    assert _read(job_logs.by_attempt([one])) == one.read_text()


def test_where_a_followed_job_picks_up_a_node_it_ran_on_before(tmp_path: Path) -> None:
    a = _log(tmp_path / "a", [(1, "one\n"), (3, "three\n")])
    assert job_logs.attempt_start(a, 3) == len("===== sluice: attempt 1 =====\none\n")
    assert job_logs.attempt_start(a, 5) is None  # not started there yet: nothing of it to read
    assert job_logs.attempt_start(_log(tmp_path / "old", [(1, "x\n")], index=False), 4) == 0
    assert job_logs.attempt_start(None, 1) == 0


def test_a_junk_index_costs_only_the_order(tmp_path: Path) -> None:
    b = _log(tmp_path / "b", [(2, "two\n")])
    a = _log(tmp_path / "a", [(1, "one\n"), (3, "three\n")])
    (tmp_path / "a" / JOB_LOG_INDEX).write_bytes(b"junk\n-1 4\n3 999999\n\xff\xfe 1\n")
    text = _read(job_logs.by_attempt([b, a]))
    assert sorted(text.splitlines()) == sorted((b.read_text() + a.read_text()).splitlines())


@given(st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=8))
def test_every_byte_once_and_attempts_in_order(nodes: list[int]) -> None:
    """Attempts 1..N on the nodes drawn: read back, each attempt's output once, in order."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        held: dict[int, list[tuple[int, str]]] = {}
        for attempt, node in enumerate(nodes, start=1):
            held.setdefault(node, []).append((attempt, f"out {attempt}\n"))
        paths = [_log(Path(d) / f"n{node}", runs) for node, runs in held.items()]
        lines = _read(job_logs.by_attempt(paths)).splitlines()
        assert [ln for ln in lines if ln.startswith("out")] == [f"out {k}" for k in range(1, len(nodes) + 1)]


def test_one_attempts_part_of_a_log(tmp_path: Path) -> None:
    """A Ray replica's log holds every attempt that ran its rank on that node: the newest
    attempt's output is a part of it (all-replicas view)."""
    a = _log(tmp_path / "a", [(1, "one\n"), (3, "three\n"), (4, "four\n")])
    assert _read(job_logs.segments([job_logs.of_attempt(a, 3)], None)) == "===== sluice: attempt 3 =====\nthree\n"
    assert _read(job_logs.segments([job_logs.of_attempt(a, 4)], 1)) == "four\n"
    assert job_logs.of_attempt(a, 2) is None  # not run there: nothing of it
    old = _log(tmp_path / "old", [(1, "x\n")], index=False)
    assert _read(job_logs.segments([job_logs.of_attempt(old, 7)], None)) == old.read_text()  # no index: whole


def test_the_newest_attempts_are_found_past_the_index_read_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index longer than the read bound (a 1,024-replica gang restarted ~80 times fills
    1 MiB): the newest attempts' records lie past its first MiB, and were not found (a follower
    of the newest attempt saw nothing; its replica view was empty). The first and last half of
    the bound are read, each cut to whole lines."""
    monkeypatch.setattr(job_logs, "MAX_INDEX_BYTES", 64)
    a = _log(tmp_path / "a", [(k, f"out {k}\n") for k in range(1, 40)])
    starts = job_logs.attempt_starts(a)
    assert starts is not None
    assert 39 in starts and 38 in starts and 1 in starts  # the newest and the oldest
    assert all(a.read_bytes()[o:].startswith(f"===== sluice: attempt {k} ".encode()) for k, o in starts.items())
    assert _read(job_logs.segments([job_logs.of_attempt(a, 39)], None)) == "===== sluice: attempt 39 =====\nout 39\n"
    text = _read(job_logs.by_attempt([a, _log(tmp_path / "b", [(40, "out 40\n")])]))
    assert text == a.read_text() + (tmp_path / "b" / "job.log").read_text()  # every byte once, in order


def test_a_followed_attempt_without_a_record_is_read_from_where_its_log_stood(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record, when it comes, wins; without one, nothing is read until the log has grown
    and RECORD_WAIT_LOOKS looks found none, then from the size first seen (not the log's start,
    which holds earlier attempts')."""
    monkeypatch.setattr(job_logs, "RECORD_WAIT_LOOKS", 3)
    a = _log(tmp_path / "a", [(1, "one\n")])
    first = a.stat().st_size
    finder = job_logs.AttemptStartFinder()
    assert [finder.find(a, 2) for _ in range(5)] == [None] * 5  # not grown: waits
    with open(a, "a") as f:
        f.write("two\n")
    assert finder.find(a, 2) == first  # grown, and the looks are spent
    late = job_logs.AttemptStartFinder()
    assert late.find(a, 3) is None
    with open(a.with_name(JOB_LOG_INDEX), "a") as f:
        f.write(f"3 {a.stat().st_size}\n")
    with open(a, "a") as f:
        f.write("three\n")
    assert [late.find(a, 3) for _ in range(4)] == [first + 4] * 4  # its record, once written
