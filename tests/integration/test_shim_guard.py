"""The shim's two rules that keep a job from outliving its node (real processes, no Ray):
the job dies with its shim, and a shim whose guard process is gone kills its job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sluice.agent.shim import CHILD_FILE, EXIT_FILE, parse_guard, process_start_ticks
from tests.integration.conftest import process_gone, wait_for

pytestmark = pytest.mark.integration

SLEEPER = [sys.executable, "-c", "import time; print('job up', flush=True); time.sleep(120)"]


def start_shim(tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "sluice.agent.shim", "--attempt-dir", str(tmp_path), "--log", str(tmp_path / "log")]
    argv += ["--cwd", str(tmp_path), *extra, "--", *SLEEPER]
    return subprocess.Popen(argv, start_new_session=True)


def job_pid(tmp_path: Path) -> int:
    assert wait_for(lambda: (tmp_path / CHILD_FILE).exists() and "job up" in (tmp_path / "log").read_text())
    return int(json.loads((tmp_path / CHILD_FILE).read_text())["pid"])


def test_start_ticks_name_one_process() -> None:
    me = process_start_ticks(os.getpid())
    assert me is not None and me == process_start_ticks(os.getpid())
    assert process_start_ticks(2**22 + 12345) is None
    assert parse_guard("12:345") == (12, 345)


def test_job_dies_when_its_shim_is_killed(tmp_path: Path) -> None:
    shim = start_shim(tmp_path)
    job = job_pid(tmp_path)
    shim.kill()  # SIGKILL the shim alone, as Ray does to a dying worker's children
    shim.wait()
    assert wait_for(lambda: process_gone(job)), "the job outlived its shim"


def test_shim_kills_its_job_when_the_guard_is_gone(tmp_path: Path) -> None:
    guard = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    start = process_start_ticks(guard.pid)
    shim = start_shim(tmp_path, "--guard", f"{guard.pid}:{start}")
    job = job_pid(tmp_path)
    time.sleep(0.5)
    assert not process_gone(job), "the guard is alive: the job must run"
    guard.kill()
    guard.wait()
    assert shim.wait(timeout=10) == -signal.SIGKILL
    assert wait_for(lambda: process_gone(job))
    exit_info = json.loads((tmp_path / EXIT_FILE).read_text())
    assert exit_info["reason"].startswith("node lost")
    assert "node lost" in (tmp_path / "log").read_text()


def test_shim_does_not_start_a_job_for_a_guard_already_gone(tmp_path: Path) -> None:
    # A pid that is alive but whose start time does not match: a reused pid is not the guard.
    start = process_start_ticks(os.getpid())
    assert start is not None
    shim = start_shim(tmp_path, "--guard", f"{os.getpid()}:{start + 1}")
    assert shim.wait(timeout=10) == -signal.SIGKILL
    assert not (tmp_path / CHILD_FILE).exists()
    assert "job not started" in json.loads((tmp_path / EXIT_FILE).read_text())["reason"]
