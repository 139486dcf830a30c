"""Two planes on one host must not hand their tenants the same uids (agent/uid_ranges.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sluice.agent.uid_ranges import UidRangeInUse, claim_uid_range
from sluice.settings import Settings
from tests.integration.conftest import remove_cgroups
from tests.isolating import needs_root
from tests.live_api import free_port
from tests.session_env import clean_env


def _record_of_dead_plane(directory: Path, home: str) -> Path:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = directory / "dead.json"
    record = {"pid": int(done.stdout), "start": 1, "home": home, "store": "sqlite:///x", "lowest": 1, "highest": 9}
    path.write_text(json.dumps(record))
    return path


def test_a_live_plane_of_another_store_with_an_overlapping_range_refuses_the_start(tmp_path: Path) -> None:
    d = tmp_path / "ranges"
    first = claim_uid_range(tmp_path / "a", "sqlite:///a.db", 200_000, 299_999, directory=d)
    with pytest.raises(UidRangeInUse, match=r"250000\.\.250010 .* overlaps 200000\.\.299999 of the plane of .*/a "):
        claim_uid_range(tmp_path / "b", "sqlite:///b.db", 250_000, 250_010, directory=d)
    assert [p.name for p in d.glob("*.json")] == [first.path.name if first.path else ""]  # b recorded nothing
    # A range of its own is fine; so is the same range for a plane of the same database.
    claim_uid_range(tmp_path / "b", "sqlite:///b.db", 300_000, 300_010, directory=d)
    claim_uid_range(tmp_path / "c", "sqlite:///a.db", 200_000, 299_999, directory=d)
    # The same home again (a restart) takes its own record over.
    again = claim_uid_range(tmp_path / "a", "sqlite:///a.db", 200_000, 299_999, directory=d)
    assert again.path == first.path and len(list(d.glob("*.json"))) == 3
    first.release()
    assert first.path is not None and not first.path.exists()


def test_a_gone_plane_s_record_is_removed_and_does_not_refuse(tmp_path: Path) -> None:
    d = tmp_path / "ranges"
    d.mkdir(mode=0o700)
    dead = _record_of_dead_plane(d, "/gone")
    claim_uid_range(tmp_path / "a", "sqlite:///a.db", 1, 9, directory=d)
    assert not dead.exists()


def test_a_record_that_is_not_one_is_ignored(tmp_path: Path) -> None:
    d = tmp_path / "ranges"
    d.mkdir(mode=0o700)
    (d / "junk.json").write_text("[1, 2")
    (d / "list.json").write_text("[1, 2]")
    os.symlink("/etc/passwd", d / "link.json")
    claim = claim_uid_range(tmp_path / "a", "sqlite:///a.db", 1, 9, directory=d)
    assert claim.path is not None and claim.path.exists()


def test_without_a_writable_folder_nothing_is_checked(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    claim = claim_uid_range(tmp_path / "a", "sqlite:///a.db", 1, 9, directory=blocker / "ranges")
    assert claim.path is None
    claim.release()


SLUICE = str(Path(sys.executable).with_name("sluice"))


@needs_root
@pytest.mark.integration
def test_sluice_up_refuses_a_second_plane_with_the_same_uid_range(tmp_path: Path) -> None:
    """Two real servers with homes (and so stores) of their own on one host."""
    roots = [f"sluice-test-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    base = clean_env()  # the session's uid range (tests/conftest.py); cgroup roots of their own below
    envs = [
        base | {"SLUICE_HOME": str(tmp_path / name), "SLUICE_PORT": str(free_port()), "SLUICE_CGROUP_ROOT": root}
        for name, root in zip(("a", "b"), roots, strict=True)
    ]

    def sluice(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SLUICE, *args], env=env, capture_output=True, text=True, timeout=120)

    try:
        first = sluice(envs[0], "up", "--detach")
        assert first.returncode == 0, first.stdout + first.stderr
        second = sluice(envs[1], "up", "--detach")
        assert second.returncode != 0
        said = second.stdout + second.stderr
        first_range = Settings()  # the range of the session (tests/conftest.py)
        assert (
            f"tenant uid range {first_range.job_uid_min}..{first_range.job_uid_max}" in said
            and f"of the plane of {tmp_path / 'a'}" in said
        ), said
        assert not (tmp_path / "b" / "server.json").exists()
        own_range = envs[1] | {"SLUICE_JOB_UID_MIN": "310000", "SLUICE_JOB_UID_MAX": "310999"}
        third = sluice(own_range, "up", "--detach")
        assert third.returncode == 0, third.stdout + third.stderr
    finally:
        for env in envs:
            sluice(env, "down")
        for root in roots:
            remove_cgroups(root)
