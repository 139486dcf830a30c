"""Reading a job's logs for `GET /v1/jobs/{id}/logs`: bounded in what one request reads and
in what one slow client makes the server hold.

A job's output may sit in several files (on Ray, one per node a moved job ran on); a read
sees them as one text, oldest first (`segments`). What is sent goes out `LOG_CHUNK` at a time,
each piece only once the client has taken the one before, so a client that does not read
holds one piece of the server's memory, not the whole 8 MiB a read may return (red-team
pass 5: 60 such clients took 700 MB).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sluice.model.runfolder import JOB_LOG_INDEX

MAX_LOG_BYTES = 8 * 1024 * 1024
"""A plain (not followed) log read returns at most this many trailing bytes."""
MAX_TAIL_LINES = 100_000
"""Largest `tail` a log request may ask for (lines)."""
LOG_CHUNK = 64 * 1024
"""A log is sent in pieces of at most this many bytes."""
_TAIL_BLOCK = 64 * 1024


@dataclass(frozen=True)
class Segment:
    """Bytes [start, end) of one log file; `newline`: a line break is owed after it (an
    attempt cut off mid-line, so the next attempt's header starts a line of its own)."""

    path: Path
    start: int
    end: int
    newline: bool = False


def read_from(path: Path | str | None, pos: int, size: int = LOG_CHUNK) -> tuple[bytes, int]:
    """Up to `size` bytes of the file from `pos`, and the position after them."""
    if not path:
        return b"", pos
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            data = f.read(size)
    except FileNotFoundError:
        return b"", pos
    return data, pos + len(data)


def tail_start(path: Path | str | None, lines: int) -> int:
    """Offset at which the file's last `lines` lines begin: 0 when it has fewer, and never
    further back than MAX_LOG_BYTES from its end."""
    if not path:
        return 0
    try:
        with open(path, "rb") as f:
            return _scan_back(f, lines)[0]
    except FileNotFoundError:
        return 0


def _scan_back(
    f: BinaryIO, lines: int, budget: int = MAX_LOG_BYTES, end: int | None = None, low: int = 0
) -> tuple[int, int]:
    """tail_start on an open file (or on its bytes [low, end)), no further back than `budget`
    bytes from the end; and how many lines lie from there to the end. Read backwards in
    blocks, so a long log costs only what is returned. A final newline ends the last line; it
    starts none."""
    size = f.seek(0, 2) if end is None else end
    floor = max(low, size - budget)
    pos, seen = size, 0
    while pos > floor:
        step = min(_TAIL_BLOCK, pos - floor)
        pos -= step
        f.seek(pos)
        block = f.read(step)
        end = len(block) - 1 if pos + step == size and block.endswith(b"\n") else len(block)
        while (nl := block.rfind(b"\n", 0, end)) >= 0:
            seen += 1
            if seen == lines:
                return pos + nl + 1, lines
            end = nl
    return floor, seen + (1 if size > floor else 0)


def segments(paths: Sequence[Path | Segment], lines: int | None, budget: int = MAX_LOG_BYTES) -> list[Segment]:
    """What of a job's logs (oldest attempt's first, the current one last; whole files, or
    the pieces of them `by_attempt` cut) a read returns: the last `lines` lines of them all,
    or without `lines` their last `budget` bytes (and never more than that with them)."""
    out: list[Segment] = []
    need = lines
    for i, part in enumerate(reversed(paths)):
        path = part.path if isinstance(part, Segment) else part
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                low, end = (part.start, min(part.end, size)) if isinstance(part, Segment) else (0, size)
                if end <= low:
                    continue
                start, found = (
                    (max(low, end - budget), 0) if need is None else _scan_back(f, need, budget, end=end, low=low)
                )
                last = b""
                if i > 0 and end > start:
                    f.seek(end - 1)
                    last = f.read(1)
        except FileNotFoundError:
            continue
        out.append(Segment(path, start, end, newline=i > 0 and end > start and last != b"\n"))
        budget -= end - start
        need = None if need is None else need - found
        if budget <= 0 or (need is not None and need <= 0):
            break
    return out[::-1]


MAX_INDEX_BYTES = 1 << 20
"""Most of a log's attempt index read (a line per attempt and replica): its first and its
last half. Records are appended in attempt order, so the newest attempts — the ones a reader
asks for — are always in the second half, however long the index grows; attempts recorded
only in the middle of a longer one are not cut apart (their output reads as the attempt
before them)."""


def _index_lines(f: BinaryIO) -> list[bytes]:
    """The whole lines in the first and last MAX_INDEX_BYTES / 2 of an index (all of a shorter
    one): a line cut by either bound is dropped, not read as a shorter number."""
    size = os.fstat(f.fileno()).st_size
    if size <= MAX_INDEX_BYTES:
        return f.read(MAX_INDEX_BYTES).splitlines()
    half = MAX_INDEX_BYTES // 2
    head = f.read(half)
    f.seek(size - half)
    tail = f.read(half)
    first = tail.find(b"\n")
    whole_tail = tail[first + 1 :] if first >= 0 else b""
    return head[: head.rfind(b"\n") + 1].splitlines() + whole_tail.splitlines()


def attempt_starts(path: Path) -> dict[int, int] | None:
    """Where each attempt's output starts in the log at `path` (runfolder.JOB_LOG_INDEX, the
    agent's record beside it; the first record of an attempt, as a gang's replicas each
    add one), or None for a log with no index (written before there was one)."""
    try:
        with open(path.with_name(JOB_LOG_INDEX), "rb") as f:
            lines = _index_lines(f)
    except (FileNotFoundError, NotADirectoryError):
        return None
    starts: dict[int, int] = {}
    for line in lines:
        attempt, _, offset = line.partition(b" ")
        if attempt.isdigit() and offset.isdigit():
            starts.setdefault(int(attempt), int(offset))
    return starts


def attempt_start(path: Path | None, attempt: int) -> int | None:
    """Where `attempt` starts in the log at `path`: a followed job that moved on to a node it
    ran on before is read from there, not from the start (which repeated the earlier
    attempts' output). 0 for a log with no index; None while the attempt has no record there
    yet (it has written nothing there: the record comes before its first byte)."""
    if path is None:
        return 0
    starts = attempt_starts(path)
    return 0 if starts is None else starts.get(attempt)


RECORD_WAIT_LOOKS = 20
"""How many times a follower (one look every FOLLOW_POLL_S, 0.25 s: 5 s) finds a followed
attempt's log grown with no record of where the attempt starts before it reads from where the
log stood when it first looked."""


class AttemptStartFinder:
    """Where a followed attempt starts in the log it writes, looked for once a round.

    The agent records the start before the attempt's first byte, so "no record" normally
    means "nothing written yet". A record the agent could not write (a full disk that then
    freed) would leave the follower waiting for the whole attempt, showing nothing of it. The
    log's size is taken before the index is first read, so a record written after that lies at
    or past it: once the log has grown and RECORD_WAIT_LOOKS looks found no record, what follows
    that size is this attempt's (the earlier attempts on that node had ended before it began)."""

    def __init__(self) -> None:
        self._key: tuple[Path, int] | None = None
        self._size_then = 0
        self._looks = 0

    def find(self, path: Path, attempt: int) -> int | None:
        if self._key != (path, attempt):
            self._key, self._looks, self._size_then = (path, attempt), 0, _size(path)
        start = attempt_start(path, attempt)
        if start is not None:
            return start
        self._looks += 1
        if self._looks >= RECORD_WAIT_LOOKS and _size(path) > self._size_then:
            return self._size_then
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def of_attempt(path: Path, attempt: int) -> Segment | None:
    """What `attempt` has written in the log at `path` so far: from its record in the index to
    the next attempt's (or the log's end now); the whole log when it has no index; None while
    the attempt has no record there (it has written nothing there), or there is no log. On
    Ray a replica's log folder is the same for every attempt that ran that rank on that node,
    so "the newest attempt's output of rank K" is a part of that file, not all of it."""
    starts = attempt_starts(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if starts is None:
        return Segment(path, 0, size)
    start = starts.get(attempt)
    if start is None:
        return None
    end = min((o for a, o in starts.items() if a > attempt and o >= start), default=size)
    return Segment(path, min(start, size), min(end, size))


def by_attempt(paths: list[Path]) -> list[Segment]:
    """The job's logs (the nodes it ran on, oldest write first) cut where each attempt starts
    and put in attempt order. A job that moved from node A to B and back to A has attempts 1
    and 3 in A's log and 2 in B's: read whole, oldest file first, they came out 2, 1, 3. Logs
    without an index (written before there was one) stay whole files, in the order given."""
    index = [attempt_starts(p) for p in paths] if len(paths) > 1 else [None]
    keyed: list[tuple[tuple[int, int, int], Segment]] = []
    for order, path in enumerate(paths):
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        starts = index[order] if None not in index else None
        cuts = sorted((offset, attempt) for attempt, offset in (starts or {}).items() if offset < size)
        if not cuts or cuts[0][0] > 0:  # no index, or output from before the first record
            cuts.insert(0, (0, cuts[0][1] if cuts else 0))
        for k, (offset, attempt) in enumerate(cuts):
            end = cuts[k + 1][0] if k + 1 < len(cuts) else size
            if end > offset:
                keyed.append(((attempt, order, offset), Segment(path, offset, end)))
    keyed.sort(key=lambda kv: kv[0])
    parts = [s for _, s in keyed]
    # A piece that does not end its last line (an attempt cut off mid-line) is owed a line
    # break, so the next piece's header starts a line of its own; the last piece is not.
    return [
        Segment(s.path, s.start, s.end, newline=k + 1 < len(parts) and read_from(s.path, s.end - 1, 1)[0] != b"\n")
        for k, s in enumerate(parts)
    ]


def pieces(parts: list[Segment]) -> Iterator[bytes]:
    """The segments' bytes, LOG_CHUNK at a time (a file that shrank ends its segment early)."""
    for s in parts:
        pos = s.start
        while pos < s.end:
            chunk, pos = read_from(s.path, pos, min(LOG_CHUNK, s.end - pos))
            if not chunk:
                break
            yield chunk
        if s.newline:
            yield b"\n"


LONGEST_LINE = 64 * 1024
"""A replica's line longer than this (or one that never ends) is sent in prefixed pieces."""


class LinePrefixer:
    """Puts `prefix` before every line of one replica's output, fed in chunks as read.

    For the all-replicas view of an engine that keeps a log per replica (Ray): each line goes
    out whole, with its rank, so that lines of different replicas interleave without mixing,
    as the local engine's shim writes them into its one log. A partial line is held until its
    end arrives (at most `longest` bytes, LONGEST_LINE unless said, then it goes out in pieces;
    a followed view of many ranks gives each a share of what it may hold)."""

    def __init__(self, prefix: bytes, longest: int = LONGEST_LINE) -> None:
        self.prefix = prefix
        self.longest = max(1, longest)
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk
        cut = data.rfind(b"\n") + 1
        done, self._held = data[:cut], data[cut:]
        out = [self.prefix + line + b"\n" for line in done[:-1].split(b"\n")] if done else []
        while len(self._held) >= self.longest:
            out.append(self.prefix + self._held[: self.longest] + b"\n")
            self._held = self._held[self.longest :]
        return b"".join(out)

    def flush(self) -> bytes:
        """The held partial line, ended (the replica's output is complete)."""
        held, self._held = self._held, b""
        return self.prefix + held + b"\n" if held else b""


def prefixed(parts_by_rank: list[list[Segment]]) -> Iterator[bytes]:
    """Each replica's segments (rank order), every line prefixed with `[rankK] `."""
    for rank, parts in enumerate(parts_by_rank):
        lines = LinePrefixer(f"[rank{rank}] ".encode())
        for chunk in pieces(parts):
            out = lines.feed(chunk)
            if out:
                yield out
        tail = lines.flush()
        if tail:
            yield tail
