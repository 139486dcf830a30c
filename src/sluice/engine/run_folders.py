"""Removing a forgotten job's folders (job retention, `control/retention.py`).

A job's run folder holds its log, its attempts' plane files and, unless its checkpoint
location says otherwise, its checkpoints; a gang's replicas each have one of their own
(`<job>--r<k>of<N>`). Once the job's record is deleted nothing names them any more, so they
go with it. Folders are found by listing the parent for the job's exact id and its replica
names, never by joining the id into a path, and removed without following a link that a
job left inside them (`shutil.rmtree` works through directory descriptors on Linux).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import uuid
from pathlib import Path

from sluice.engine.ray_gang import parse_replica

log = logging.getLogger(__name__)


def _is_folder_of(name: str, job_id: str) -> bool:
    """`name` is the job's own folder, or one of its gang's replicas'."""
    return name == job_id or (parse_replica(name)[0] == job_id and parse_replica(name)[2] > 1)


def remove_job_folders(parent: Path, job_id: str) -> int:
    """Remove every folder of `job_id` directly in `parent` (the job's, its replicas'); how
    many went. A link with the job's name is unlinked, not followed; one that cannot be
    removed is logged and left."""
    if not job_id or "/" in job_id or job_id in (".", ".."):
        raise ValueError(f"not a job id: {job_id!r}")
    try:
        names = [e.name for e in os.scandir(parent) if e.name.startswith(job_id) and _is_folder_of(e.name, job_id)]
    except FileNotFoundError:
        return 0
    gone = 0
    for name in names:
        path = parent / name
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                _remove_tree(path)
            else:
                os.unlink(path)
            gone += 1
        except FileNotFoundError:
            continue
        except OSError as err:
            log.warning("could not remove %s of forgotten job %s: %s", path, job_id, err)
    return gone


DEPTH = 200
"""Deepest a tree is walked with one folder descriptor open a level (`_flatten`)."""


def _remove_tree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except PermissionError:
        # A folder the job made unlistable to its owner (the plane's own user, which is the
        # job's too without isolation): opened up, then removed once more.
        _open_up(path)
        shutil.rmtree(path)
    except (RecursionError, OSError) as err:
        # shutil.rmtree (Python < 3.13) recurses, and holds a descriptor, once a level: a job
        # that nested folders thousands deep stopped it half way. Flattened, then once more.
        if isinstance(err, OSError) and err.errno != errno.EMFILE:
            raise
        _flatten(path)
        shutil.rmtree(path)


def _flatten(top: Path, depth: int = DEPTH) -> None:
    """Move every folder more than `depth` below `top` up into `top` (renamed by descriptor,
    never through a link), so that no folder under it is deeper than `depth`: each moved one
    is walked from its new place, so every folder is visited once, with at most `depth`
    descriptors open."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    top_fd = os.open(top, flags)
    try:
        roots: list[str | None] = [None]  # None: `top` itself; else a folder moved into it
        while roots:
            name = roots.pop()
            try:
                first = os.dup(top_fd) if name is None else os.open(name, flags, dir_fd=top_fd)
            except OSError:
                continue  # gone, or a link put in its place: rmtree deals with it
            fds, todo = [first], [_subfolders(first)]
            try:
                while fds:
                    if not todo[-1]:
                        os.close(fds.pop())
                        todo.pop()
                        continue
                    sub = todo[-1].pop()
                    if len(fds) >= depth:
                        moved = f".sluice-deep-{uuid.uuid4().hex}"
                        try:
                            os.rename(sub, moved, src_dir_fd=fds[-1], dst_dir_fd=top_fd)
                        except FileNotFoundError:
                            continue
                        roots.append(moved)
                        continue
                    try:
                        fd = os.open(sub, flags, dir_fd=fds[-1])
                    except OSError:
                        continue  # gone, or now a link: not followed
                    fds.append(fd)
                    todo.append(_subfolders(fd))
            finally:
                for fd in fds:
                    os.close(fd)
    finally:
        os.close(top_fd)


def _subfolders(fd: int) -> list[str]:
    """The names of the folders (not links) in the folder open at `fd`."""
    with os.scandir(fd) as entries:
        return [e.name for e in entries if e.is_dir(follow_symlinks=False)]


def _open_up(top: Path) -> None:
    """Give the owner rwx on `top` and every folder under it, each before the walk lists it
    (links are not followed)."""
    _owner_rwx(str(top))
    for here, dirs, _ in os.walk(top, followlinks=False):
        for d in dirs:
            _owner_rwx(os.path.join(here, d))


def _owner_rwx(path: str) -> None:
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(path, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
    except OSError:
        pass
