"""A job's progress file is its own: what it writes there can mislead its own scheduling and
nothing else. Before, one record with a step past 64 bits made every reconcile round fail
(the store refused it): the job's exit was never recorded, a cancel was a 500, and after a
restart the finished job ran again."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from sluice.control.plane import ControlPlane
from sluice.model import Phase
from sluice.settings import Settings
from sluice.spec import parse_job_spec

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"


def test_a_job_writing_records_no_sdk_would_cannot_stop_the_plane(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", reconcile_interval_s=0.1, isolation="off")
    plane = ControlPlane.from_settings(settings)
    plane.bootstrap_tenants()
    plane.start()
    try:
        caller = plane.store.get_tenant("default")
        bad = plane.submit(
            caller,
            parse_job_spec({"command": [sys.executable, str(JOBS / "bad_progress.py")], "resources": {"cpu": 0.5}}),
        )
        other = plane.submit(
            caller,
            parse_job_spec(
                {
                    "command": [sys.executable, str(JOBS / "sdk_loop.py"), "--steps", "40", "--sleep", "0.1"],
                    "resources": {"cpu": 0.5},
                }
            ),
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if all(plane.get_job(caller, j.id).phase.terminal for j in (bad, other)):
                break
            time.sleep(0.2)
        done, fine = plane.get_job(caller, bad.id), plane.get_job(caller, other.id)
        assert done.phase == Phase.SUCCEEDED, done.reason  # its exit was recorded
        assert done.step == 3  # the honest report; none of the others
        assert fine.phase == Phase.SUCCEEDED and fine.step >= 30, fine.reason  # the other job's progress went on
        rounds = plane.controller.rounds
        time.sleep(1.0)
        assert plane.controller.rounds > rounds  # the rounds go on
    finally:
        plane.stop()
    # a restart finds nothing to run again
    plane = ControlPlane.from_settings(settings)
    plane.start()
    try:
        time.sleep(1.0)
        caller = plane.store.get_tenant("default")
        again = plane.get_job(caller, bad.id)
        assert again.phase == Phase.SUCCEEDED and again.attempt == 1
    finally:
        plane.stop()
