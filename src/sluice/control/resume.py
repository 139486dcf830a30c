"""Starting a new job from another job's checkpoint (`--resume-from ID`).

The checkpoints are copied, not shared: the new job writes its own checkpoints in its own
folder and the old job's stay as they were. Only `ckpt-<step>.pt` files are copied (the
SDK's finished checkpoints; a half-written temporary file never is), the newest last.

Under tenant isolation the source folder belongs to the old job's uid, which could have put
anything in it — a symlink to the plane's admin token, a FIFO — and the plane copies as root.
So a local copy opens the folder and each file without following links, takes only regular
files owned by that uid (what the tenant itself wrote: nothing it could not read anyway), and
writes each copy 0600, owned by the new job's uid, never over an existing name. The new job's
folder is made by walking down from a trusted folder without following a link
(agent/isolation.py confined_dir): a folder on the way may be the tenant's own.

The copy is made as root inside the request, where the tenant's disk quota does not apply, so
what one resume copies is bounded (settings resume_max_copy_mb): by the files' sizes before a
byte is copied, and again while copying (a file another job of the tenant keeps growing). A
sparse file is copied sparse (SEEK_DATA/SEEK_HOLE): its holes count against the bound but are
never written out. And so is how many copies run at once (`CopySlots`): the new job does not
exist while its checkpoints are copied, so the tenant's cap on unfinished jobs does not count
them, and without a bound one tenant's parallel resumes multiplied the disk a resume may fill
and held every API worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import fsspec

from sluice.agent.isolation import confined_dir
from sluice.control.errors import TooBusy
from sluice.control.job_files import open_own
from sluice.model import JobUser
from sluice.model.progress import MAX_STEP


class CopySlots:
    """How many resume copies run at once: at most `per_tenant` of one tenant's and `total`
    in all. A request over either bound is refused (TooBusy, a 429) before it copies a byte.
    The same bound serves other long requests that hold an API worker thread (the dataset
    source operations: `what` names them, `settings` the two settings that bound them)."""

    def __init__(
        self,
        per_tenant: int,
        total: int,
        what: str = "resume_from: {} checkpoint copies",
        settings: tuple[str, str] = ("resume_copies_per_tenant", "resume_copies"),
    ) -> None:
        self.per_tenant = per_tenant
        self.total = total
        self.what = what
        self.settings = settings
        self._held: dict[str, int] = {}
        self._mu = threading.Lock()

    @contextlib.contextmanager
    def slot(self, tenant: str) -> Iterator[None]:
        with self._mu:
            mine, everyone = self._held.get(tenant, 0), sum(self._held.values())
            if mine >= self.per_tenant:
                raise TooBusy(
                    f"{self.what.format(f'tenant {tenant!r} already has {mine}')} under way, the most at once "
                    f"(setting {self.settings[0]}); retry when one has finished"
                )
            if everyone >= self.total:
                raise TooBusy(
                    f"{self.what.format(everyone)} are under way on this plane, the most at once "
                    f"(setting {self.settings[1]}); retry later"
                )
            self._held[tenant] = mine + 1
        try:
            yield
        finally:
            with self._mu:
                self._held[tenant] -= 1
                if not self._held[tenant]:
                    del self._held[tenant]


_CKPT = re.compile(r"^ckpt-(\d+)\.pt$")


def _step_of(name: str) -> int | None:
    """The step of a checkpoint's file name, or None: not `ckpt-<step>.pt`, or a step past
    MAX_STEP. The old job's folder is its own to name files in: ckpt-<30 digits>.pt was copied as
    the newest, and its step, past 64 bits, made the new job's record one the store refuses
    (stuck Pending, its cancel a 500, two tracebacks a round)."""
    m = _CKPT.match(name)
    if m is None or len(m.group(1)) > 16:
        return None
    step = int(m.group(1))
    return step if step <= MAX_STEP else None


_CHUNK = 1 << 20
DEFAULT_MAX_BYTES = 64 << 30


class TooLarge(OSError):
    """The checkpoints to copy are larger than what one resume may copy."""


def _too_large(name: str, size: int, limit: int) -> TooLarge:
    return TooLarge(
        f"{name} is {_size_text(size)} ({size} bytes), more than the {_size_text(limit)} one resume may copy "
        "(setting resume_max_copy_mb)"
    )


def _size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def copy_checkpoints(
    src_dir: str,
    dst_dir: str,
    keep: int = 1,
    owner: JobUser | None = None,
    *,
    dst_base: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[str, int] | None:
    """Copy the newest `keep` checkpoints of `src_dir` into `dst_dir`; the newest copy's path
    and step, or None when there is none. Local paths and fsspec URLs alike. `owner`: under
    isolation, the tenant uid whose jobs wrote `src_dir` and will read `dst_dir` (local only:
    a URL is an admin's checkpoint root, where a job cannot plant links). `dst_base`: the
    trusted folder a local `dst_dir` is made below (default: its parent, which must exist).
    More than `max_bytes` in all is a TooLarge (an OSError), and nothing is left behind of
    the file that went over."""
    if "://" not in src_dir and "://" not in dst_dir:
        return _copy_local(
            src_dir, dst_dir, keep, owner, dst_base or os.path.dirname(os.path.abspath(dst_dir)), max_bytes
        )
    src_fs, src_root = fsspec.core.url_to_fs(src_dir)
    dst_fs, dst_root = fsspec.core.url_to_fs(dst_dir)
    if not src_fs.exists(src_root):
        return None
    found: list[tuple[int, str]] = []
    for path in src_fs.ls(src_root, detail=False):
        step = _step_of(str(path).rstrip("/").rsplit("/", 1)[-1])
        if step is not None:
            found.append((step, str(path)))
    if not found:
        return None
    found.sort()
    total = sum(int(src_fs.size(path) or 0) for _, path in found[-keep:])
    if total > max_bytes:
        raise _too_large(f"job's newest checkpoints ({len(found[-keep:])})", total, max_bytes)
    dst_fs.makedirs(dst_root, exist_ok=True)
    newest: tuple[str, int] | None = None
    copied = 0
    for step, path in found[-keep:]:
        target = f"{dst_root.rstrip('/')}/ckpt-{step}.pt"
        with src_fs.open(path, "rb") as fin, dst_fs.open(target, "wb") as fout:
            while chunk := fin.read(_CHUNK):
                copied += len(chunk)
                if copied > max_bytes:
                    raise _too_large(f"ckpt-{step}.pt (at least)", copied, max_bytes)
                fout.write(chunk)
        newest = (target if "://" not in dst_dir else f"{dst_dir.rstrip('/')}/ckpt-{step}.pt", step)
    return newest


def _copy_local(
    src_dir: str, dst_dir: str, keep: int, owner: JobUser | None, dst_base: str, max_bytes: int
) -> tuple[str, int] | None:
    try:
        folder = os.open(src_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:  # the folder itself is a link
            raise OSError(f"{src_dir} is a symbolic link, not a checkpoint folder") from None
        raise
    try:
        found = sorted((step, name) for name in os.listdir(folder) if (step := _step_of(name)) is not None)
        if not found:
            return None
        sources = [(step, name, open_own(folder, name, owner)) for step, name in found[-keep:]]
        try:
            sizes = [os.fstat(fd).st_size for _, _, fd in sources]
            if sum(sizes) > max_bytes:
                what = sources[-1][1] if len(sources) == 1 else f"the newest {len(sources)} checkpoints"
                raise _too_large(what, sum(sizes), max_bytes)
            dst = confined_dir(Path(dst_base), Path(dst_dir), owner)
            try:
                newest: tuple[str, int] | None = None
                left = max_bytes
                for step, name, src in sources:
                    left -= _copy_one(src, dst, name, f"ckpt-{step}.pt", owner, left)
                    newest = (os.path.join(dst_dir, f"ckpt-{step}.pt"), step)
                return newest
            finally:
                os.close(dst)
        finally:
            for _, _, fd in sources:
                os.close(fd)
    finally:
        os.close(folder)


def _copy_one(src: int, folder: int, name: str, target: str, owner: JobUser | None, limit: int) -> int:
    """Copy the open `src` (`name`) to `target` in the open `folder`: the copy 0600, `owner`'s,
    made new (never through an existing name), holes kept; its size, at most `limit` (else
    TooLarge, and the copy is removed)."""
    dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
    try:
        if owner is not None:
            os.fchown(dst, owner.uid, owner.gid)
        size = _copy_sparse(src, dst, name, limit)
    except BaseException:
        os.close(dst)
        with contextlib.suppress(OSError):
            os.unlink(target, dir_fd=folder)
        raise
    os.close(dst)
    return size


def _copy_sparse(src: int, dst: int, name: str, limit: int) -> int:
    """Copy the data extents of `src` to the same offsets of `dst` (the holes stay holes); the
    size copied. Past `limit` bytes (a file that grows while copied) is a TooLarge."""
    pos = 0
    while True:
        try:
            start = os.lseek(src, pos, os.SEEK_DATA)
            end = os.lseek(src, start, os.SEEK_HOLE)
        except OSError as err:
            if err.errno == errno.ENXIO:  # no data after pos: the rest is a hole, up to the end
                break
            if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            start, end = pos, max(pos, os.fstat(src).st_size)  # no SEEK_DATA here: all data
            if start == end:
                break
        if end > limit:
            raise _too_large(f"{name} (at least)", end, limit)
        off = start
        while off < end:
            chunk = os.pread(src, min(_CHUNK, end - off), off)
            if not chunk:  # shrunk meanwhile
                break
            view = memoryview(chunk)
            while view:
                written = os.pwrite(dst, view, off)
                off += written
                view = view[written:]
        pos = off if off > start else end
    size = os.fstat(src).st_size
    if size > limit:
        raise _too_large(name, size, limit)
    os.ftruncate(dst, size)  # a trailing hole, and the end of a file that shrank meanwhile
    return size
