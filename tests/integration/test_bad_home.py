"""`sluice up` (foreground and --detach) and `python -m sluice.server` with a home they cannot
use: one line on stderr naming the folder and the problem, exit code 1, no traceback, nothing
started. Real CLI processes, a real read-only mount (tests/readonly.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..readonly import read_only_mount
from ..session_env import clean_env

pytestmark = pytest.mark.integration

SLUICE = str(Path(sys.executable).with_name("sluice"))


def run(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(keep=("SLUICE_CGROUP_ROOT", "SLUICE_JOB_UID_MIN", "SLUICE_JOB_UID_MAX"))
    env.update(SLUICE_HOME=str(home), SLUICE_PORT="0")
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def assert_refused(proc: subprocess.CompletedProcess[str], message: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"error: {message}"], proc.stderr


@pytest.fixture
def ro(tmp_path: Path) -> Iterator[Path]:
    with read_only_mount(tmp_path / "ro") as path:
        yield path


@pytest.mark.parametrize("detach", [False, True], ids=["foreground", "detached"])
def test_up_on_a_read_only_home(ro: Path, detach: bool) -> None:
    proc = run(ro, SLUICE, "up", *(["--detach"] if detach else []))
    assert_refused(proc, f"SLUICE_HOME {ro} is on a read-only file system")


def test_up_under_a_read_only_parent(ro: Path) -> None:
    proc = run(ro / "home", SLUICE, "up", "--detach")
    assert_refused(proc, f"SLUICE_HOME {ro}/home cannot be created: its parent {ro} is on a read-only file system")


def test_up_on_a_home_that_is_a_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("not a folder\n")
    proc = run(home, SLUICE, "up", "--detach")
    assert_refused(proc, f"SLUICE_HOME {home} is not a folder (a file is in the way)")
    assert home.read_text() == "not a folder\n"


def test_the_server_module_on_a_read_only_home(ro: Path) -> None:
    proc = run(ro, sys.executable, "-m", "sluice.server")
    assert_refused(proc, f"SLUICE_HOME {ro} is on a read-only file system")


@pytest.mark.parametrize("detach", [False, True], ids=["foreground", "detached"])
def test_up_where_only_the_kernel_refuses_the_folder(detach: bool) -> None:
    """/proc passes every permission check (root may write it) but makes no folders: the
    refusal is still one line naming the home, not an exception's name."""
    home = Path("/proc/sluice-no-such-home")
    proc = run(home, SLUICE, "up", *(["--detach"] if detach else []))
    assert_refused(proc, f"SLUICE_HOME {home} cannot be created: No such file or directory")
