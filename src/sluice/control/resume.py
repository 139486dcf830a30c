"""Starting a new job from another job's checkpoint (`--resume-from ID`).

The checkpoints are copied, not shared: the new job writes its own checkpoints in its own
folder and the old job's stay as they were. Only `ckpt-<step>.pt` files are copied (the
SDK's finished checkpoints; a half-written temporary file never is), the newest last.

Under tenant isolation the source folder belongs to the old job's uid, which could have put
anything in it — a symlink to the plane's admin token, a FIFO — and the plane copies as root.
So a local copy opens the folder and each file without following links, takes only regular
files owned by that uid (what the tenant itself wrote: nothing it could not read anyway), and
writes each copy 0600, owned by the new job's uid, never over an existing name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat

import fsspec

from sluice.model import JobUser

_CKPT = re.compile(r"^ckpt-(\d+)\.pt$")
_CHUNK = 1 << 20


def copy_checkpoints(src_dir: str, dst_dir: str, keep: int = 1, owner: JobUser | None = None) -> tuple[str, int] | None:
    """Copy the newest `keep` checkpoints of `src_dir` into `dst_dir`; the newest copy's path
    and step, or None when there is none. Local paths and fsspec URLs alike. `owner`: under
    isolation, the tenant uid whose jobs wrote `src_dir` and will read `dst_dir` (local only:
    a URL is an admin's checkpoint root, where a job cannot plant links)."""
    if "://" not in src_dir and "://" not in dst_dir:
        return _copy_local(src_dir, dst_dir, keep, owner)
    src_fs, src_root = fsspec.core.url_to_fs(src_dir)
    dst_fs, dst_root = fsspec.core.url_to_fs(dst_dir)
    if not src_fs.exists(src_root):
        return None
    found: list[tuple[int, str]] = []
    for path in src_fs.ls(src_root, detail=False):
        m = _CKPT.match(str(path).rstrip("/").rsplit("/", 1)[-1])
        if m:
            found.append((int(m.group(1)), str(path)))
    if not found:
        return None
    found.sort()
    dst_fs.makedirs(dst_root, exist_ok=True)
    newest: tuple[str, int] | None = None
    for step, path in found[-keep:]:
        target = f"{dst_root.rstrip('/')}/ckpt-{step}.pt"
        with src_fs.open(path, "rb") as fin, dst_fs.open(target, "wb") as fout:
            while chunk := fin.read(_CHUNK):
                fout.write(chunk)
        newest = (target if "://" not in dst_dir else f"{dst_dir.rstrip('/')}/ckpt-{step}.pt", step)
    return newest


def _copy_local(src_dir: str, dst_dir: str, keep: int, owner: JobUser | None) -> tuple[str, int] | None:
    try:
        folder = os.open(src_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:  # the folder itself is a link
            raise OSError(f"{src_dir} is a symbolic link, not a checkpoint folder") from None
        raise
    try:
        found = sorted((int(m.group(1)), name) for name in os.listdir(folder) if (m := _CKPT.match(name)))
        if not found:
            return None
        os.makedirs(dst_dir, exist_ok=True)
        newest: tuple[str, int] | None = None
        for step, name in found[-keep:]:
            target = os.path.join(dst_dir, f"ckpt-{step}.pt")
            _copy_one(folder, name, target, owner)
            newest = (target, step)
        return newest
    finally:
        os.close(folder)


def _copy_one(folder: int, name: str, target: str, owner: JobUser | None) -> None:
    """Copy `name` (in the open `folder`) to `target`: a regular file, not a link, owned by
    `owner` when given; the copy 0600, `owner`'s, made new (never through an existing name)."""
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{name} is not a regular file")
        if owner is not None and st.st_uid != owner.uid:
            raise OSError(f"{name} is not the job's own file (owner uid {st.st_uid})")
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            if owner is not None:
                os.fchown(dst, owner.uid, owner.gid)
            while chunk := os.read(src, _CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst, view) :]
        except BaseException:
            os.close(dst)
            with contextlib.suppress(OSError):
                os.unlink(target)
            raise
        os.close(dst)
    finally:
        os.close(src)
