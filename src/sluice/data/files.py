"""Crash-safe file writes and checked reads for the cache tiers.

An item becomes visible under its final name only by `rename` after its bytes were written
and fsynced, so a process killed mid-write leaves at most a temp file (named with its pid, and
removed by recovery) — never a torn item under the name readers open.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets

TMP_MARK = ".sluice-tmp."
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def tmp_name(path: str) -> str:
    return f"{path}{TMP_MARK}{os.getpid()}.{secrets.token_hex(4)}"


def tmp_owner(name: str) -> int | None:
    """The pid that was writing a temp file, or None if `name` is not one of ours."""
    if TMP_MARK not in name:
        return None
    try:
        return int(name.rsplit(TMP_MARK, 1)[1].split(".", 1)[0])
    except ValueError:
        return None


def write_atomic(path: str, data: bytes | memoryview, durable: bool = True) -> None:
    """Write `data` to `path` all-or-nothing (temp file, fsync, rename, directory fsync)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = tmp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def read_exact(path: str, size: int) -> bytes | None:
    """The file's bytes if it exists and has exactly `size` bytes; None if it is missing.

    Raises ValueError when the size is wrong (a damaged item the caller must drop).
    """
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        return None
    try:
        data = os.read(fd, size + 1) if size < 0x7FFFF000 else _read_all(fd)
    finally:
        os.close(fd)
    if len(data) != size:
        raise ValueError(f"{path}: {len(data)} bytes on disk, {size} expected")
    return data


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 26):
        chunks.append(chunk)
    return b"".join(chunks)


def map_file(path: str, size: int) -> mmap.mmap | None:
    """A read-only shared mapping of the file (zero copy from tmpfs), None if missing."""
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        return None
    try:
        actual = os.fstat(fd).st_size
        if actual != size:
            raise ValueError(f"{path}: {actual} bytes on disk, {size} expected")
        if size == 0:
            return None
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)


def unlink_quiet(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
