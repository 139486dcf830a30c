"""A dataset warm under isolation runs a helper of the tenant's uid that holds up to `workers`
items in memory at once, whole, and the tenant chooses how big its items are (each up to
1 TiB). Red team s26: the helper ran in no memory cgroup, so one warm of a dataset with a
huge file could take the node's memory. It now runs in a memory cgroup of `warm_memory_mb`
(default a quarter of RAM), made before it is sent its request; past it the warm fails, and
says why."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from sluice.agent.node_agent import NodeAgent
from sluice.model import JobUser
from sluice.settings import Settings
from tests.integration.conftest import remove_cgroups
from tests.isolating import needs_root

CAROL = JobUser(231_301, 231_301)


@needs_root
def test_a_warm_past_its_memory_limit_is_killed_and_says_so(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "small.bin").write_bytes(b"x" * 1000)
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        home=tmp_path / "home", cgroup_root=cgroup_root, warm_memory_mb=256, dataset_roots=[str(tmp_path)]
    )
    settings.home.mkdir(mode=0o711)
    agent = NodeAgent("n0", settings.runs_dir, settings=settings)
    try:
        parent = agent.layout.memory_parent
        if parent is None:
            pytest.skip(f"no cgroup memory controller here ({agent.layout.reason})")
        ok = agent.warm_dataset("carol/small", str(src), run_as=CAROL)
        assert ok.error is None and ok.files_fetched == 1, ok  # a warm within its limit works
        with open(src / "big.bin", "wb") as f:
            f.truncate(700 << 20)  # sparse: no disk, but 700 MiB of bytes once read
        big = agent.warm_dataset("carol/big", str(src), workers=1, run_as=CAROL)
        assert big.error is not None and "memory limit of 256 MiB" in big.error, big
        assert not [d for d in parent.iterdir() if d.name.startswith("sluice-warm-")]  # each jail removed
    finally:
        agent.close()
        remove_cgroups(cgroup_root)
