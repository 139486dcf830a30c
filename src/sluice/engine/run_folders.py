"""Removing a forgotten job's folders (job retention, `control/retention.py`).

A job's run folder holds its log, its attempts' plane files and, unless its checkpoint
location says otherwise, its checkpoints; a gang's replicas each have one of their own
(`<job>--r<k>of<N>`). Once the job's record is deleted nothing names them any more, so they
go with it. Folders are found by listing the parent for the job's exact id and its replica
names, never by joining the id into a path, and removed without following a link that a
job left inside them (`shutil.rmtree` works through directory descriptors on Linux).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
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


def _remove_tree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except PermissionError:
        # A folder the job made unlistable to its owner (the plane's own user, which is the
        # job's too without isolation): opened up, then removed once more.
        _open_up(path)
        shutil.rmtree(path)


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
