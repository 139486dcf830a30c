"""`check_home`: a $SLUICE_HOME the server cannot keep its state in is refused up front, with
one line that names the folder and the problem (sluice.server)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.server import HomeError, check_home, make_home

from ..readonly import read_only_mount


@pytest.fixture
def ro(tmp_path: Path) -> Iterator[Path]:
    with read_only_mount(tmp_path / "ro") as path:
        yield path


def test_a_writable_home_passes_and_is_not_created(tmp_path: Path) -> None:
    check_home(tmp_path)
    check_home(tmp_path / "new" / "home")
    assert not (tmp_path / "new").exists()


def test_a_file_in_place_of_the_home_is_named(tmp_path: Path) -> None:
    (tmp_path / "home").write_text("")
    with pytest.raises(HomeError, match=r"^SLUICE_HOME .*/home is not a folder \(a file is in the way\)$"):
        check_home(tmp_path / "home")


def test_a_file_in_place_of_a_parent_is_named(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(HomeError, match=r"/f/home cannot be created: .*/f is a file, not a folder$"):
        check_home(tmp_path / "f" / "home")


def test_a_read_only_home_is_named(ro: Path) -> None:
    with pytest.raises(HomeError, match=rf"^SLUICE_HOME {ro} is on a read-only file system$"):
        check_home(ro)


def test_a_home_under_a_read_only_parent_is_named(ro: Path) -> None:
    with pytest.raises(HomeError, match=rf"^SLUICE_HOME {ro}/a/b cannot be created: its parent {ro} is on a read-only"):
        check_home(ro / "a" / "b")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits; the read-only mount tests cover it")
def test_a_home_under_an_unwritable_parent_is_named(tmp_path: Path) -> None:
    parent = tmp_path / "locked"
    parent.mkdir(mode=0o500)
    try:
        with pytest.raises(HomeError, match=r"its parent .*/locked is not writable by this user$"):
            check_home(parent / "home")
    finally:
        parent.chmod(0o700)


def test_make_home_creates_it_or_names_what_the_kernel_refused(tmp_path: Path) -> None:
    make_home(tmp_path / "a" / "home")
    assert (tmp_path / "a" / "home").is_dir()
    with pytest.raises(HomeError, match="SLUICE_HOME /proc/sluice-nope cannot be created: No such file"):
        make_home(Path("/proc/sluice-nope"))
