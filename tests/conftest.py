"""Session-wide test set-up for tenant isolation (docs/security.md).

The tests run as root in CI, so the control plane runs each tenant's jobs as an unprivileged
uid. Two things on a test machine are out of such a uid's reach and are fixed here, for the
tests only:
- the test venv's interpreter (under /root): SLUICE_JOB_PYTHON points at one every uid can run
  (tests/jobpython.py);
- pytest's temporary folders (0700): the folders above `tmp_path` are made passable (o+x,
  never listable by others) and `tmp_path` itself 1777 like /tmp, so a job can read the
  scripts a test writes there and leave the marker files (pids, steps) tests look for.
  The plane's own folders under it ($SLUICE_HOME) get their modes from the plane.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from sluice.agent.cgroup import remove_root
from sluice.data.settings import CacheSettings, cache_dirs
from tests.jobpython import make_job_python

# Property tests check behaviour, never speed: hypothesis's default 200 ms a case failed one
# (a 0.3 ms case took 372 ms) on a VM that other work kept busy. Speed goals are benchmarks'.
hypothesis_settings.register_profile("sluice", deadline=None)
hypothesis_settings.load_profile("sluice")

# pytest-xdist's workers start with COLUMNS=80 set; rich would pin the CLI's module-level
# console to that width at import, and tests that set COLUMNS themselves would see 80.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

_made: list[Path] = []
_SHM = Path("/dev/shm")
_shm_before: set[str] = set()


_homes: set[str] = set()
"""Every sluice home a plane of this session's process opened its cache for."""
_for_home = CacheSettings.for_home.__func__  # type: ignore[attr-defined]


def _recording_for_home(cls: type[CacheSettings], home: Path) -> CacheSettings:
    _homes.add(str(Path(home).resolve()))
    return _for_home(cls, home)  # type: ignore[no-any-return]


CacheSettings.for_home = classmethod(_recording_for_home)  # type: ignore[method-assign,assignment]


def memory_dir_name(home: str) -> str:
    """The memory tier's folder name of a plane whose home is `home` (data.settings.cache_dirs)."""
    return cache_dirs(Path(home))[1].name


def _folders_under(roots: list[Path], depth: int = 4) -> set[str]:
    """Every folder up to `depth` below `roots` (where subprocess planes' homes are)."""
    out: set[str] = set()
    for root in roots:
        base = len(root.parts)
        for here, dirs, _ in os.walk(root):
            if len(Path(here).parts) - base >= depth:
                dirs[:] = []
            out.add(str(Path(here).resolve()))
    return out


def _shm_entries() -> set[str]:
    """sluice's folders in /dev/shm (node caches' memory tier, e2e scratch): RAM, not disk."""
    try:
        return {p.name for p in _SHM.iterdir() if p.name.startswith("sluice-")}
    except OSError:
        return set()


_own_cgroup_root: list[str] = []
_ROOT_SET_HERE = "SLUICE_TESTS_OWN_CGROUP_ROOT"
"""Where pytest_configure notes the cgroup root it chose, so a worker can tell it from one given."""
WORKER_UIDS = (200_000, 25_000)
"""Tenant uids of xdist worker gwN: 25,000 from 200,000 + N × 25,000 (gw0..gw3 share sluice's
default range; the tests that pick a range of their own use 300,000 and up)."""


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path factory reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    _shm_before.update(_shm_entries())
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... in a worker of `pytest -n N`
    if worker is not None and os.environ.get("SLUICE_CGROUP_ROOT") == os.environ.get(_ROOT_SET_HERE):
        # A worker inherits its controller's environment: a root and a uid range of its own, so
        # that planes of two workers running at once are not refused as one plane twice.
        del os.environ["SLUICE_CGROUP_ROOT"]
        if "SLUICE_JOB_UID_MIN" not in os.environ and "SLUICE_JOB_UID_MAX" not in os.environ:
            first = WORKER_UIDS[0] + int(worker.removeprefix("gw")) * WORKER_UIDS[1]
            os.environ["SLUICE_JOB_UID_MIN"] = str(first)
            os.environ["SLUICE_JOB_UID_MAX"] = str(first + WORKER_UIDS[1] - 1)
    if "SLUICE_CGROUP_ROOT" not in os.environ:
        # The planes this session starts (and the `sluice up` it runs) make their node cgroups
        # under a root of the session's own: a plane already running on this machine (a
        # developer's `sluice up`, another test session) has the same node names under the
        # default root, and sluice refuses a second plane there (agent/node_owners.py).
        root = f"sluice-tests-{os.getpid()}"
        os.environ["SLUICE_CGROUP_ROOT"] = root
        os.environ[_ROOT_SET_HERE] = root
        _own_cgroup_root.append(root)
    if os.geteuid() != 0:
        return
    if config.option.basetemp is None:
        # pytest's shared /tmp/pytest-of-root is reset to 0700 by every other pytest run on the
        # machine; a root of this session's own stays passable.
        root = Path(tempfile.mkdtemp(prefix="sluice-tests-"))
        root.chmod(0o711)
        _made.append(root)
        config.option.basetemp = str(root / "basetemp")
    if "SLUICE_JOB_PYTHON" not in os.environ:
        python, folder = make_job_python()
        if python is not None and folder is not None:
            os.environ["SLUICE_JOB_PYTHON"] = python
            _made.append(folder)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Name the threads a test left running: a thread still inside a C extension (sqlite, ssl,
    Ray's gRPC) when the interpreter finalizes can crash the process after the summary, so a
    leak is reported here, where it can be traced to its test."""
    config = session.config
    config._sluice_exitstatus = exitstatus  # type: ignore[attr-defined]
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    if left:
        names = ", ".join(f"{t.name}{' (daemon)' if t.daemon else ''}" for t in left)
        print(f"\nthreads still running at session end: {names}", file=sys.stderr)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove this session's folders, then leave with pytest's verdict, skipping interpreter
    finalization.

    After the summary is printed the interpreter tears down Ray's core worker (gRPC threads),
    torch and the other C extensions the suite imported; one CI run crashed there (SIGSEGV)
    after "522 passed", and make reported the crash instead of the result. Nothing a test
    checks happens after this point, and the threads still running were named at session
    end. SLUICE_TEST_FINALIZE=1 keeps the normal exit (to chase such a crash)."""
    for root in _own_cgroup_root:
        with contextlib.suppress(OSError, ValueError):
            remove_root(root)
    roots = _folders_under(_made)
    for folder in _made:
        shutil.rmtree(folder, ignore_errors=True)
    _made.clear()
    # Planes the tests started put their cache's memory tier in /dev/shm/sluice-<hash of their
    # home>; those go with the session (RAM, and a later session's planes would find them).
    # Only this session's: another test session running at the same time (a second clone)
    # has its own planes' folders there, and removing them mid-run failed its tests.
    mine = {memory_dir_name(h) for h in _homes | roots}
    for name in (_shm_entries() - _shm_before) & mine:
        shutil.rmtree(_SHM / name, ignore_errors=True)
    status = getattr(config, "_sluice_exitstatus", None)
    if status is None or os.environ.get("SLUICE_TEST_FINALIZE") == "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(status))


def passable(path: Path, stop: Path) -> None:
    """o+x on `path` and its parents below `stop`: a job uid may pass through, not list."""
    for p in (path, *path.parents):
        st = p.stat()
        if not st.st_mode & stat.S_IXOTH:
            p.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
        if p == stop or p.parent == p:
            break


@pytest.fixture
def tmp_path(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """pytest's tmp_path, passable by the tenant uids jobs run as (see the module docstring)."""
    if os.geteuid() == 0:
        passable(tmp_path.parent, tmp_path_factory.getbasetemp().parent)
        tmp_path.chmod(0o1777)
    yield tmp_path
