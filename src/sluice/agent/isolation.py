"""Tenant isolation on a node: may this process run jobs as other users, and the file side of it.

Tenants are mutually untrusted (docs/security.md). When isolation is on, each tenant's jobs run
as the tenant's own unprivileged uid/gid (`JobUser`), switched to by the per-attempt shim. That
needs privilege: root, or a service user holding the capabilities in `REQUIRED_CAPS` (ambient,
so that they survive the exec of the shim). Without it isolation is off, and sluice says so.

The file rule that keeps a root process safe among folders a job can write: the plane never
reads or writes a path whose folder the job may change. So the run folder of a job is built
of plane-owned folders (0711: a job may pass through to what is its own, but list nothing)
holding plane files (0600), plus the few places that are the job's (0700, owned by its uid):
its progress file, its checkpoints, its default work folder. A job cannot swap any of the
plane's names for a symlink, because it cannot write the folders they are in.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from sluice.model import JobUser

REQUIRED_CAPS: dict[str, int] = {
    "CAP_CHOWN": 0,  # hand a job its folders
    "CAP_DAC_OVERRIDE": 1,  # read a job's progress and checkpoints (0700, the job's uid)
    "CAP_FOWNER": 3,  # chmod what the job owns
    "CAP_KILL": 5,  # signal a job that runs as another uid
    "CAP_SETGID": 6,  # setgroups([]) + setgid in the shim's child
    "CAP_SETUID": 7,  # setuid in the shim's child
}
"""Linux capability bits the plane needs to isolate tenants (capabilities(7))."""

PLANE_DIR_MODE = 0o711
"""A plane folder on the way to job-owned ones: jobs may pass through, never list it."""
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class IsolationUnavailable(RuntimeError):
    """isolation=on was asked for, but this process may not switch users."""


@dataclass(frozen=True)
class Isolation:
    """Whether tenants' jobs run as their own users here, and why (said by `sluice up`)."""

    enabled: bool
    reason: str


def missing_capabilities(status: str | None = None) -> list[str]:
    """The capabilities of REQUIRED_CAPS this process lacks in its effective set."""
    if status is None:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return list(REQUIRED_CAPS)
    effective = 0
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            effective = int(line.split()[1], 16)
    return [name for name, bit in REQUIRED_CAPS.items() if not effective >> bit & 1]


def detect_isolation(mode: str = "auto", status: str | None = None) -> Isolation:
    """Resolve settings.isolation (auto, on, off) against this process's privilege."""
    if mode == "off":
        return Isolation(False, "isolation is off (settings: isolation=off): every job runs as the plane's own user")
    missing = missing_capabilities(status)
    if not missing:
        who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()} with the needed capabilities"
        return Isolation(True, f"isolation is on: the plane runs as {who}; each tenant's jobs run as its own uid")
    reason = (
        f"isolation is off: the plane runs as uid {os.geteuid()} without {', '.join(missing)}, so it cannot run "
        "jobs as other users; every job runs as the plane's own user and can read the others' data"
    )
    if mode == "on":
        raise IsolationUnavailable(reason.replace("isolation is off", "isolation=on cannot be honoured", 1))
    return Isolation(False, reason)


# ------------------------------------------------------------------------------ folders


def own_dir(path: Path, mode: int, owner: JobUser | None = None) -> Path:
    """mkdir `path` (its parent must exist and be the plane's), then set its owner and mode.
    Refuses anything but a real folder at that name: a symlink is never followed (the owner
    and mode are set on the folder opened, never through the name again)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OSError(f"{path} exists and is not a folder") from None
        raise
    try:
        _set_owner_mode(fd, mode, owner)
    finally:
        os.close(fd)
    return path


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _set_owner_mode(fd: int, mode: int, owner: JobUser | None) -> None:
    st = os.fstat(fd)
    if owner is not None and (st.st_uid, st.st_gid) != (owner.uid, owner.gid):
        os.fchown(fd, owner.uid, owner.gid)
    if stat.S_IMODE(st.st_mode) != mode:
        os.fchmod(fd, mode)


class UnsafeFolder(OSError):
    """A folder the plane was to make or hand over lies through a symlink, a folder of someone
    else's or outside the trusted folder it must be in: refused for good, never followed."""


def confined_dir(base: Path, path: Path, owner: JobUser | None, mode: int = PRIVATE_DIR_MODE) -> int:
    """An open descriptor (the caller closes it) of the folder `path`, strictly below the
    trusted folder `base`, made where missing and handed to `owner` with `mode`.

    A job may own folders on the way (an absolute checkpoint location below an admin's root
    runs through the tenant's own folders), and could swap one for a symlink at any time: so
    the path is walked from `base` one name at a time, each opened with O_NOFOLLOW relative to
    the one before (mkdir, fchown and fchmod act on what was opened, never on a name again).
    A symlink, a non-folder, or a folder owned by anyone but root, the plane and `owner` is
    an UnsafeFolder; folders made on the way are the plane's (PLANE_DIR_MODE)."""
    base_abs = Path(os.path.abspath(base))
    full = Path(os.path.abspath(path))
    if base_abs not in full.parents:
        raise UnsafeFolder(f"{path} is not below {base}")
    names = full.relative_to(base_abs).parts
    if any(n in ("", ".", "..") for n in names):
        raise UnsafeFolder(f"{path}: '.' and '..' are not walked")
    allowed = {0, os.geteuid(), *([owner.uid] if owner is not None else [])}
    fd = os.open(base_abs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # trusted: the plane's or the admin's
    try:
        for i, name in enumerate(names):
            last = i == len(names) - 1
            made = False
            try:
                os.mkdir(name, mode if last else PLANE_DIR_MODE, dir_fd=fd)
                made = True
            except FileExistsError:
                pass
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = base_abs.joinpath(*names[: i + 1])
                    raise UnsafeFolder(f"{where} is a symbolic link or not a folder; it is never followed") from None
                raise
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if st.st_uid not in allowed:
                where = base_abs.joinpath(*names[: i + 1])
                raise UnsafeFolder(f"{where} belongs to uid {st.st_uid}, neither the plane nor the job's")
            if last:
                _set_owner_mode(fd, mode, owner)
            elif made:
                os.fchmod(fd, PLANE_DIR_MODE)  # mkdir's mode went through the umask
    except BaseException:
        os.close(fd)
        raise
    return fd


def plane_dirs(path: Path, mode: int = PLANE_DIR_MODE, stop: Path | None = None) -> Path:
    """`mkdir -p` of plane-owned folders with `mode` (missing ones only, and those below
    `stop`, which are set to `mode` even when present)."""
    missing = []
    p = path
    while not p.exists() or (stop is not None and p != stop and stop in p.parents):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        own_dir(d, mode)
    return path


def plane_owned(path: Path) -> Path:
    """`path`, checked to be a folder the plane may rely on as its own: a real folder (not a
    link), owned by this process's uid, writable by no one else. A folder at a predictable
    name in a world-writable place (the cache's memory tier in /dev/shm) could have been made
    first by a tenant's job or another user, who would then own everything made inside it.
    OSError naming the folder and its owner otherwise."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a folder (a link or a file is in its place); remove it")
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OSError(
            f"{path} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}, not to the plane "
            f"(uid {os.geteuid()}, writable by it alone): something else made it first; remove it and restart"
        )
    return path


def own_file(path: Path, owner: JobUser | None, mode: int = PRIVATE_FILE_MODE) -> Path:
    """Create an empty file (never following a symlink) owned by `owner`, `mode`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return path


# ------------------------------------------------------------------------------ access


def _allowed(st: os.stat_result, user: JobUser, want: int) -> bool:
    if st.st_uid == user.uid:
        bits = st.st_mode >> 6 & 7
    elif st.st_gid == user.gid:
        bits = st.st_mode >> 3 & 7
    else:
        bits = st.st_mode & 7
    return bits & want == want


def _walk(path: Path) -> list[Path]:
    """Every folder from / down to path's parent, then path itself."""
    return [*reversed(path.parents), path]


def unreachable(path: str | Path, user: JobUser, want: int) -> str | None:
    """Why `user` (no supplementary groups) cannot reach `path` with `want` (os.R_OK, os.X_OK,
    ...), judged by permission bits along the path as written and as resolved; None if it can.
    ACLs are not read, so an ACL that grants more can only make this refuse wrongly, never
    allow wrongly."""
    if user.uid == 0:
        return None
    written = Path(os.path.abspath(path))
    real = Path(os.path.realpath(path))
    for chain in (written, real):
        steps = _walk(chain)
        for i, p in enumerate(steps):
            last = i == len(steps) - 1
            try:
                st = os.stat(p) if (last or chain is real) else os.lstat(p)
            except OSError as err:
                return f"{p}: {err.strerror}"
            if stat.S_ISLNK(st.st_mode):
                continue  # its target is checked on the resolved chain
            need = want if last else os.X_OK
            if not _allowed(st, user, need):
                what = "read and execute" if need == os.R_OK | os.X_OK else "execute" if need == os.X_OK else "read"
                return f"{user} may not {what} {p} (mode {stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid})"
    return None


def interpreter_paths(python: str) -> list[tuple[str, int]]:
    """What a job run by `python` must reach: the program, and — for this very interpreter —
    its standard library and the sluice SDK the job imports."""
    need = [(python, os.X_OK)]
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        need.append((os.path.dirname(os.__file__), os.R_OK | os.X_OK))
        need.append((str(Path(__file__).resolve().parents[1] / "sdk"), os.R_OK | os.X_OK))
    return need


def interpreter_problem(python: str, user: JobUser) -> str | None:
    """Why jobs running as `user` could not run `python` (a job's `python` command), or None.
    Asked once when the plane starts, so that an interpreter under a private folder (a pyenv
    under /root, say) is named before the first job fails on it."""
    for path, want in interpreter_paths(python):
        problem = unreachable(path, user, want)
        if problem is not None:
            return (
                f"jobs run as tenant uids and cannot use the job interpreter {python}: {problem}; every job "
                "whose command is `python ...` will fail to launch. Install sluice where every user may read "
                "it, on an interpreter they may run (e.g. `rm -rf .venv && PYTHON=/usr/bin/python3 "
                "scripts/setup.sh`), or set SLUICE_JOB_PYTHON to one (docs/security.md)"
            )
    return None


def launch_problem(argv0: str, cwd: Path, user: JobUser, python: str | None) -> str | None:
    """Why a job run as `user` could not start `argv0` in `cwd`, or None."""
    checks = interpreter_paths(argv0) if python and argv0 == python else [(argv0, os.X_OK)]
    checks.append((str(cwd), os.R_OK | os.X_OK))
    for path, want in checks:
        problem = unreachable(path, user, want)
        if problem is not None:
            return (
                f"the job runs as {user} and cannot use {path}: {problem}. Put the program, its interpreter "
                "(settings job_python) and the workdir where every tenant uid may read them (see docs/security.md)"
            )
    return None
