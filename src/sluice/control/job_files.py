"""A job's files, read back by its tenant (`sluice job files`, `sluice job download`).

What a job writes — a trained model in its HOME (`work/`), results, its checkpoints — lies in
its run folder on a node, which a tenant of the API cannot reach otherwise. The plane reads
it as root, from folders the job's uid owns and may have filled with anything: a link to the
plane's admin token or to another tenant's folder, a FIFO that blocks a reader, a hard link
to a file it may not read. So:

- a path is relative, at most `MAX_DEPTH` names of at most `MAX_NAME` bytes, none empty, `.`
  or `..`;
- only the job's own parts are shown: `work/`, `tmp/` and what the job made beside them (its
  checkpoints), never the plane's (`attempt-*/`, the log, which `job logs` reads);
- each folder is opened from its parent's descriptor without following a link (O_NOFOLLOW),
  starting at the run folder the plane made, so no name leads out of it;
- a file is read only if it is a regular file (opened non-blocking, checked with fstat) and,
  under tenant isolation, owned by the job's uid: what the job wrote, which its tenant could
  read anyway (a hard link to a file of root's or another uid's is refused);
- a name that is not UTF-8 is left out of a listing (it could not be sent, nor asked for);
- a listing shows at most `MAX_ENTRIES` names of one folder, and says it was cut; it stats only
  those it shows, holds no more names than that, and reads at most `MAX_SCANNED` names (a job
  can fill a folder with millions of empty files, at no disk cost to speak of).

A link, a FIFO or a foreign file reads as "no such file": nothing about what lies outside
the job's folder is told.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sluice.model import JobUser
from sluice.model.runfolder import TMP_DIR, WORK_DIR, plane_name
from sluice.spec.errors import FieldProblem, SpecError

MAX_DEPTH = 64
"""Most names in a path (folders deeper than this are not shown)."""
MAX_PATH = 4096
"""Most characters in a path (PATH_MAX)."""
MAX_NAME = 255
"""Most bytes in one name of a path (NAME_MAX): a longer one names nothing, and os.open's
ENAMETOOLONG was a 500 (red team s29)."""
MAX_ENTRIES = 10_000
"""Most names one listing shows (the rest are counted as cut)."""
MAX_SCANNED = 1_000_000
"""Most names of one folder a listing reads (in the folder's own order); any past them are
neither shown nor counted. A job can make millions of empty files in its HOME: a listing
that read, stat-ed and held every name cost the API server seconds and hundreds of MiB each
time its tenant asked (red team s29)."""
CHUNK = 1 << 20
"""Bytes read at a time while a file is sent."""


class NoSuchFile(LookupError):
    """Not there, not the job's own, or not a file or folder the job may hand out."""


class WrongKind(NoSuchFile):
    """A folder of the job's asked for as a file, or its file as a folder: said as it is (the
    tenant may list both), where a link or another uid's file stays a plain NoSuchFile."""


@dataclass(frozen=True)
class FileEntry:
    name: str
    kind: Literal["file", "folder"]
    size: int
    """Bytes (a file), or 0 (a folder)."""
    modified: float
    """Unix time of its last change."""


@dataclass(frozen=True)
class Listing:
    path: str
    entries: list[FileEntry]
    cut: int
    """Names left out past MAX_ENTRIES (0: all shown)."""


def parts_of(path: str) -> list[str]:
    """The names of a relative path within a job's folder; a SpecError naming `path` for one
    that could lead out of it or is not a path at all."""
    if len(path) > MAX_PATH or "\x00" in path:
        raise SpecError([FieldProblem("path", f"at most {MAX_PATH} characters and no NUL")])
    if path.startswith("/"):
        raise SpecError([FieldProblem("path", "a path within the job's folder, not an absolute one")])
    parts = [p for p in path.split("/") if p != ""] if path.strip("/") else []
    if any(p in (".", "..") for p in parts):
        raise SpecError([FieldProblem("path", "'.' and '..' are not allowed")])
    if len(parts) > MAX_DEPTH:
        raise SpecError([FieldProblem("path", f"at most {MAX_DEPTH} names deep")])
    if any(len(os.fsencode(p)) > MAX_NAME for p in parts):
        raise SpecError([FieldProblem("path", f"each name at most {MAX_NAME} bytes")])
    return parts


def shown_at_top(name: str) -> bool:
    """Whether a name directly in a run folder is the job's to hand out: its HOME, its TMPDIR,
    and anything it made beside them (its checkpoints), never what the plane keeps there."""
    return name in (WORK_DIR, TMP_DIR) or plane_name(name) is None


def _open_folder(run_dir: Path, parts: list[str], owner: JobUser | None = None) -> int:
    """The folder `parts` below `run_dir`, opened one name at a time from its parent's
    descriptor without following a link; NoSuchFile when any step is not a real folder
    (WrongKind where it is the job's own regular file)."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise NoSuchFile("the job has no run folder here") from None
    for depth, name in enumerate(parts):
        try:
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as err:
            is_file = err.errno == errno.ENOTDIR and _is_own(fd, name, owner, stat.S_ISREG)
            os.close(fd)
            if is_file:
                shown = "/".join(parts[: depth + 1])
                raise WrongKind(f"{shown!r} is a file, not a folder: sluice job download fetches it") from None
            if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES, errno.EPERM):
                raise NoSuchFile("no such folder") from None
            raise
        os.close(fd)
        fd = nxt
    return fd


def _is_own(folder: int, name: str, owner: JobUser | None, kind: Callable[[int], bool]) -> bool:
    """Whether `name` in `folder` is itself (never through a link) of `kind` and the job's own."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return False
    return kind(st.st_mode) and (owner is None or st.st_uid == owner.uid)


def _base(run_dir: Path, parts: list[str], elsewhere: Mapping[str, Path]) -> Path:
    """Where the first of `parts` is looked up: the run folder, or the folder `elsewhere` names
    for it (Ray keeps a job's checkpoints under the shared checkpoint root, not in its run
    folder: {"checkpoints": <root>/<job>})."""
    return elsewhere.get(parts[0], run_dir) if parts else run_dir


def list_folder(
    run_dir: Path, path: str, owner: JobUser | None, elsewhere: Mapping[str, Path] | None = None
) -> Listing:
    """The files and folders at `path` in the job's run folder, by name (see the module's
    docstring for what is shown); links, FIFOs and other users' files are left out.
    `elsewhere`: top-level names kept in another folder (`_base`)."""
    elsewhere = elsewhere or {}
    parts = parts_of(path)
    if parts and not shown_at_top(parts[0]):
        raise NoSuchFile("no such folder")
    fd = _open_folder(_base(run_dir, parts, elsewhere), parts, owner)
    entries: list[FileEntry] = []
    try:
        with os.scandir(fd) as found:
            named = 0

            def candidates() -> Iterator[str]:
                """Names of files and folders (by the type the folder tells: no stat), at most
                MAX_SCANNED read; at the top, those kept `elsewhere` from there instead."""
                nonlocal named
                for e in itertools.islice(found, MAX_SCANNED):
                    top_ok = parts or (shown_at_top(e.name) and e.name not in elsewhere)
                    if top_ok and _utf8(e.name) and _file_or_folder(e):
                        named += 1
                        yield e.name
                if not parts:
                    for name in _present(elsewhere):
                        named += 1
                        yield name

            # The first MAX_ENTRIES by name, never more held; only these are stat-ed.
            first = heapq.nsmallest(MAX_ENTRIES, candidates())
        for name in first:
            try:
                if not parts and name in elsewhere:
                    st = os.stat(elsewhere[name] / name, follow_symlinks=False)
                else:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                continue  # links, FIFOs, sockets, devices: nothing to hand out
            if stat.S_ISREG(st.st_mode) and owner is not None and st.st_uid != owner.uid:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            entries.append(FileEntry(name, "folder" if is_dir else "file", 0 if is_dir else st.st_size, st.st_mtime))
    finally:
        os.close(fd)
    cut = named - len(first)
    return Listing("/".join(parts), entries, cut)


def _utf8(name: str) -> bool:
    """Whether a name read from a folder is UTF-8: one that is not (its bytes decoded with
    surrogates) could not be written as JSON, and no path over HTTP could name it."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _file_or_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file(follow_symlinks=False) or entry.is_dir(follow_symlinks=False)
    except OSError:
        return False  # gone meanwhile


def _present(elsewhere: Mapping[str, Path]) -> list[str]:
    return [name for name, base in elsewhere.items() if os.path.lexists(base / name)]


def open_file(
    run_dir: Path, path: str, owner: JobUser | None, elsewhere: Mapping[str, Path] | None = None
) -> tuple[int, int]:
    """The file at `path` in the job's run folder (or `elsewhere`: `_base`), opened for
    reading, and its size: a regular file (under isolation the job's uid's), reached without
    following a link. NoSuchFile otherwise. The caller closes the descriptor."""
    parts = parts_of(path)
    if not parts or not shown_at_top(parts[0]):
        raise NoSuchFile("no such file")
    folder = _open_folder(_base(run_dir, parts, elsewhere or {}), parts[:-1], owner)
    try:
        fd = open_own(folder, parts[-1], owner)
    except OSError:
        if _is_own(folder, parts[-1], None, stat.S_ISDIR):  # a listing shows folders, whoever's
            raise WrongKind(f"{'/'.join(parts)!r} is a folder, not a file: sluice job files lists it") from None
        raise NoSuchFile("no such file") from None
    finally:
        os.close(folder)
    try:
        size = os.fstat(fd).st_size
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, size


def open_own(folder: int, name: str, owner: JobUser | None) -> int:
    """`name` in the open `folder`, opened for reading without following a link or blocking on
    a FIFO: a regular file, owned by `owner` when given (what the job wrote); an OSError saying
    why otherwise. Also how a `--resume-from` copy opens its source (control/resume.py)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{name} is not a regular file")
        if owner is not None and st.st_uid != owner.uid:
            raise OSError(f"{name} is not the job's own file (owner uid {st.st_uid})")
    except BaseException:
        os.close(fd)
        raise
    return fd


class FileReader:
    """An open file's first `size` bytes (its size when opened: a file the job is still
    writing is sent as it was), CHUNK at a time. `close` closes the file whether or not it was
    read (a client gone before the first byte)."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd: int | None = fd
        self.size = size
        self._sent = 0

    def next_chunk(self) -> bytes | None:
        """The next piece, or None at the end (or once the file shrank or was closed)."""
        if self._fd is None or self._sent >= self.size:
            return None
        chunk = os.pread(self._fd, min(CHUNK, self.size - self._sent), self._sent)
        if not chunk:
            return None
        self._sent += len(chunk)
        return chunk

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
