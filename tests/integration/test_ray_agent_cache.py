"""The Ray node agent's dataset cache is the one its jobs read (no Ray cluster: the actor class
runs in this process, as Ray would run it in a worker of the node's raylet).

A raylet started the way docs/ray.md shows has no SLUICE_* variables: the agent then caches in
the folders the plane's settings name (carried by the engine), not in `~/.sluice/cache` of the
raylet's user, and points every job that reads datasets at exactly those folders, whatever
the plane put in the job's environment. A raylet's own SLUICE_CACHE_* variables win.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from sluice.agent.ray_actor import RayNodeAgent
from sluice.engine.ray import agent_settings_from
from sluice.model import Allocation, JobExited, LaunchRequest
from sluice.settings import Settings
from sluice.spec import JobSpec

pytestmark = [pytest.mark.integration, pytest.mark.serial]

PRINT_CACHE = (
    "import json, os; "
    "print('CACHE=' + json.dumps([os.environ[v] for v in ('SLUICE_CACHE_DISK_DIR', 'SLUICE_CACHE_MEMORY_DIR')]))"
)


def _raylet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The raylet's environment: no SLUICE_* at all, a HOME of its own (its ~/.sluice stays untouched)."""
    for var in list(os.environ):
        if var.startswith("SLUICE_"):
            monkeypatch.delenv(var)
    home = tmp_path / "raylet-user"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def _job_cache_env(agent: RayNodeAgent, tmp_path: Path, plane_env: dict[str, str]) -> list[str]:
    spec = JobSpec(command=[sys.executable, "-c", PRINT_CACHE], workdir=str(tmp_path))
    req = LaunchRequest(
        "reader", 1, "t1", spec, Allocation.single("n0", 1.0, None), str(tmp_path / "ckpt"), env=plane_env
    )
    agent.launch(req)
    deadline = time.monotonic() + 60
    while not any(isinstance(e, JobExited) for e in agent.poll()):
        assert time.monotonic() < deadline, "the job did not exit"
        time.sleep(0.1)
    lines = [ln for ln in Path(agent.log_path("reader")).read_text().splitlines() if ln.startswith("CACHE=")]
    assert lines, Path(agent.log_path("reader")).read_text()
    return list(json.loads(lines[-1][len("CACHE=") :]))


def _warm(agent: RayNodeAgent, src: Path) -> None:
    ticket = agent.warm_start("t1~blobs-1", str(src), None, 2)
    report = None
    deadline = time.monotonic() + 60
    while report is None:
        assert time.monotonic() < deadline, "the warm did not finish"
        report = agent.warm_result(ticket, 1.0)
    assert report.error is None, report.error
    assert report.files_fetched == 3


@pytest.mark.parametrize("raylet_sets_cache", [False, True])
def test_a_ray_agent_warms_the_cache_its_jobs_are_pointed_at(
    sluice_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raylet_sets_cache: bool
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"item-{i}.bin").write_bytes(bytes([i]) * 1000)
    plane = sluice_settings.model_copy(update={"dataset_roots": [str(src)]})
    carried = plane.cache.model_dump(mode="json")  # what RayEngine gives every agent
    raylet_home = _raylet_env(monkeypatch, tmp_path)
    want = [str(plane.cache.disk_dir), str(plane.cache.memory_dir)]
    if raylet_sets_cache:
        want = [str(tmp_path / "node-disk"), str(tmp_path / "node-mem")]
        monkeypatch.setenv("SLUICE_CACHE_DISK_DIR", want[0])
        monkeypatch.setenv("SLUICE_CACHE_MEMORY_DIR", want[1])
    agent = RayNodeAgent(
        "n0", 1.0, str(plane.runs_dir / "nodes" / "n0"), settings=agent_settings_from(plane), cache=carried
    )
    try:
        _warm(agent, src)
        files = [p for d in want for p in Path(d).rglob("*") if p.is_file() and "blobs" in str(p)]
        assert files, f"nothing warmed into {want}"
        assert not (raylet_home / ".sluice").exists()  # not the raylet user's default home
        # The plane put its own folders (or, on another machine, folders that do not exist) in
        # the env; the agent points the job at the ones it warmed.
        plane_env = {
            "SLUICE_DATASETS": "{}",
            "SLUICE_CACHE_DISK_DIR": str(tmp_path / "plane-disk"),
            "SLUICE_CACHE_MEMORY_DIR": str(tmp_path / "plane-mem"),
        }
        assert _job_cache_env(agent, tmp_path, plane_env) == want
        assert agent.drop_dataset("t1~blobs-1") >= 1
        assert not [p for d in want for p in Path(d).rglob("*") if p.is_file() and "blobs" in str(p)]
    finally:
        agent.close()
