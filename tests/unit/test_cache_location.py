"""Where a node's dataset cache lives is decided in one place (`data.settings.cache_dirs`):
the control plane (what it tells jobs), the node agent and a bare `CacheSettings()` in a job
all land on the same folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.data.settings import CacheSettings, cache_dirs
from sluice.settings import Settings


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("SLUICE_CACHE_DISK_DIR", "SLUICE_CACHE_MEMORY_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_every_route_to_the_cache_agrees(home: Path) -> None:
    disk, memory = cache_dirs(home)
    assert disk == home / "cache"
    assert memory.name.startswith("sluice-") and memory.parent in (Path("/dev/shm"), disk)
    plane = Settings().cache
    assert (plane.disk_dir, plane.memory_dir) == (disk, memory)
    bare = CacheSettings()  # a job or the SDK with only its environment
    assert (bare.resolved_disk_dir(), bare.resolved_memory_dir()) == (disk, memory)


def test_two_homes_never_share_a_memory_tier(home: Path, tmp_path: Path) -> None:
    assert cache_dirs(home)[1] != cache_dirs(tmp_path / "other")[1]


def test_explicit_folders_win_everywhere(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_CACHE_DISK_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("SLUICE_CACHE_MEMORY_DIR", str(tmp_path / "m"))
    plane = Settings().cache
    assert (plane.disk_dir, plane.memory_dir) == (tmp_path / "d", tmp_path / "m")
    bare = CacheSettings()
    assert (bare.resolved_disk_dir(), bare.resolved_memory_dir()) == (tmp_path / "d", tmp_path / "m")
