"""The plane's hold on its home (`lock_home`) and its lasting database session tag
(`plane_tag`), sluice.server: a restarted plane ends its dead predecessor's lingering
PostgreSQL session by that tag, so only a process holding the home may use it, and only the
home it was made for (tests/integration/test_postgres_store.py has the database side)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.server import PLANE_TAG_FILE, AlreadyRunning, HomeError, lock_home, plane_tag

HOLD = """\
import sys, time
from pathlib import Path
from sluice.server import lock_home
lock_home(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


def test_one_process_at_a_time_holds_a_home(tmp_path: Path) -> None:
    """server.json is written once a plane serves: two planes started at once on one home both
    passed it. The second is refused naming the first's pid, and the lock goes with the first."""
    fd = lock_home(tmp_path)
    try:
        with pytest.raises(AlreadyRunning, match=rf"a sluice server \(pid {os.getpid()}\) is already running for"):
            lock_home(tmp_path)
    finally:
        os.close(fd)
    os.close(lock_home(tmp_path))


def test_a_home_whose_plane_was_killed_is_free_again(tmp_path: Path) -> None:
    """kill -9 (like a crash or a reboot) releases the home: that is what lets the next plane
    take its predecessor's tag."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(AlreadyRunning, match=rf"\(pid {holder.pid}\)"):
            lock_home(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    os.close(lock_home(tmp_path))


def test_the_tag_outlives_a_restart_and_is_kept_0600(tmp_path: Path) -> None:
    tag = plane_tag(tmp_path)
    assert tag.startswith("sluice-plane-") and plane_tag(tmp_path) == tag
    path = tmp_path / PLANE_TAG_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["tag"] == tag
    assert [p.name for p in tmp_path.iterdir()] == [PLANE_TAG_FILE]  # no temporary file left


def test_a_copied_home_gets_a_tag_of_its_own(tmp_path: Path) -> None:
    """A copy of a home (a second plane set up from the first's) with the same tag would end the
    first plane's live session as its own predecessor's, and the first then the copy's."""
    first = tmp_path / "first"
    first.mkdir()
    tag = plane_tag(first)
    copy = tmp_path / "copy"
    shutil.copytree(first, copy)
    assert plane_tag(copy) != tag
    assert plane_tag(first) == tag


def test_a_link_in_place_of_the_tag_or_the_lock_is_refused_naming_it(tmp_path: Path) -> None:
    """Following a planted link, the plane would trust (or overwrite) a file elsewhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(json.dumps({"tag": "sluice-plane-0123456789abcdef"}))
    home = tmp_path / "home"
    home.mkdir()
    (home / PLANE_TAG_FILE).symlink_to(elsewhere)
    with pytest.raises(HomeError, match=rf"{home}/plane-tag .* is a symbolic link, which sluice does not follow"):
        plane_tag(home)
    (home / "plane.lock").symlink_to(tmp_path / "lock-elsewhere")
    with pytest.raises(HomeError, match=rf"{home}/plane.lock .* is a symbolic link"):
        lock_home(home)
    assert not (tmp_path / "lock-elsewhere").exists()


@pytest.mark.parametrize("content", ["", "not json", '{"tag": "sluice-plane-x"}', '{"tag": 7}', "[]"])
def test_an_unreadable_tag_is_a_clear_error_naming_the_file(tmp_path: Path, content: str) -> None:
    """Not silently replaced: the new tag would leave the predecessor's lingering session
    holding the database, refused as another plane's, with nothing saying why."""
    (tmp_path / PLANE_TAG_FILE).write_text(content)
    with pytest.raises(HomeError, match=rf"^{tmp_path}/plane-tag \(the plane's database session tag\) cannot be read"):
        plane_tag(tmp_path)


def test_a_folder_in_place_of_the_tag_is_named(tmp_path: Path) -> None:
    (tmp_path / PLANE_TAG_FILE).mkdir()
    with pytest.raises(HomeError, match=r"plane-tag \(the plane's database session tag\) is not a regular file"):
        plane_tag(tmp_path)
