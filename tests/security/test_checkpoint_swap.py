"""An absolute checkpoint.location is checked against the admin's checkpoint_roots at submit,
but the folders below a root may be the tenant's own, and its job can swap one for a symlink
after submit (red team s18 F1). The agent (root) then made the checkpoint folder through the
link — outside the roots, or inside another tenant's run folder — and handed it to the tenant.
It now walks down from the root without following a link, and checks the root again."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.agent.isolation import UnsafeFolder, confined_dir
from sluice.agent.launchenv import LaunchError
from sluice.agent.node_agent import NodeAgent
from sluice.control.confine import checkpoint_dir, confine_checkpoint
from sluice.model import Allocation, JobUser, LaunchRequest
from sluice.settings import Settings
from sluice.spec import JobSpec
from tests.integration.conftest import kill_runs, remove_cgroups
from tests.isolating import needs_root

ALICE = JobUser(231_011, 231_011)
BOB = JobUser(231_012, 231_012)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgent]:
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    root = tmp_path / "ckroot"
    root.mkdir()
    settings = Settings(
        home=tmp_path / "home", cgroup_root=cgroup_root, job_max_open_files=1000, checkpoint_roots=[str(root)]
    )
    settings.home.mkdir(mode=0o711)
    a = NodeAgent("n0", settings.runs_dir, settings=settings)
    yield a
    a.close()
    kill_runs(settings.runs_dir)
    remove_cgroups(cgroup_root)


def _request(agent: NodeAgent, job: str, location: str) -> LaunchRequest:
    spec = JobSpec(command=["python", "-c", "pass"], checkpoint={"location": location})
    folder = checkpoint_dir(location, str(agent.runs_dir), job)
    return LaunchRequest(job, 1, "alice", spec, Allocation.single("n0"), folder, run_as=ALICE)


def _tenant_folder(path: Path, user: JobUser) -> Path:
    path.mkdir(mode=0o700)
    os.chown(path, user.uid, user.gid)
    return path


@needs_root
def test_a_folder_swapped_for_a_symlink_after_submit_is_never_followed(agent: NodeAgent, tmp_path: Path) -> None:
    root = Path(agent.settings.checkpoint_roots[0])
    mine = _tenant_folder(root / "alice", ALICE)
    evil = _tenant_folder(mine / "evil", ALICE)
    outside = tmp_path / "target"  # stands in for /etc
    outside.mkdir()
    bob_run = agent.job_dir("j-bob")
    bob_run.mkdir(mode=0o711)
    locations = {}
    for name in ("out", "bob"):
        _tenant_folder(evil / name, ALICE)
        # accepted at submit: it resolves inside the root
        locations[name] = confine_checkpoint(str(evil / name), agent.settings.checkpoint_roots)
        assert locations[name] == str(evil / name)
    # ... then the job swaps the folders for links
    for name, target in (("out", outside), ("bob", bob_run)):
        (evil / name).rmdir()
        (evil / name).symlink_to(target)
    for k, name in enumerate(("out", "bob")):
        location = locations[name]
        assert location is not None
        with pytest.raises(LaunchError, match="symbolic link"):
            agent.launch(_request(agent, f"j-a{k}", location))
    assert list(outside.iterdir()) == []
    assert list(bob_run.iterdir()) == []
    # a folder on the way that another tenant owns is refused too
    _tenant_folder(root / "shared", BOB)
    with pytest.raises(LaunchError, match="belongs to uid 231012"):
        agent.launch(_request(agent, "j-a3", str(root / "shared")))
    assert list((root / "shared").iterdir()) == []


@needs_root
def test_a_location_no_longer_in_the_roots_is_refused_at_launch(agent: NodeAgent, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(LaunchError, match="not inside the storage roots"):
        agent.launch(_request(agent, "j-gone", str(elsewhere)))
    assert list(elsewhere.iterdir()) == []


@needs_root
def test_the_normal_cases_still_make_the_jobs_folder(agent: NodeAgent) -> None:
    root = Path(agent.settings.checkpoint_roots[0])
    mine = _tenant_folder(root / "alice", ALICE)
    for job, location in (("j-abs", str(mine)), ("j-root", str(root)), ("j-rel", "ckpt/inner")):
        agent.launch(_request(agent, job, location))
        leaf = Path(checkpoint_dir(location, str(agent.runs_dir), job))
        st = leaf.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (ALICE.uid, 0o700), leaf
        above = leaf.parent.stat()
        assert (above.st_uid, stat.S_IMODE(above.st_mode)) == (os.geteuid(), 0o711), leaf.parent


def test_confined_dir_walks_without_following_links(tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "a").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (base / "a" / "link").symlink_to(tmp_path / "out")
    with pytest.raises(UnsafeFolder, match="symbolic link"):
        confined_dir(base, base / "a" / "link" / "job" / "checkpoints", None)
    assert list((tmp_path / "out").iterdir()) == []
    with pytest.raises(UnsafeFolder, match="not below"):
        confined_dir(base, tmp_path / "out" / "x", None)
    fd = confined_dir(base, base / "a" / "job" / "checkpoints", None)
    os.close(fd)
    assert stat.S_IMODE((base / "a" / "job").stat().st_mode) == 0o711
    assert stat.S_IMODE((base / "a" / "job" / "checkpoints").stat().st_mode) == 0o700
    # the leaf itself swapped for a link: refused, its target's mode untouched
    (base / "a" / "leaf").symlink_to(tmp_path / "out")
    before = stat.S_IMODE((tmp_path / "out").stat().st_mode)
    with pytest.raises(UnsafeFolder):
        confined_dir(base, base / "a" / "leaf", None)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == before
