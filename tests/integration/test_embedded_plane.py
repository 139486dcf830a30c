"""Embedded planes (benchmarks, the demo) keep their cgroups to themselves and leave none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.agent.cgroup import CgroupKind, detect_cgroups, remove_root
from sluice.bench.scenario import embedded_plane

pytestmark = pytest.mark.integration


def _v1_cpu() -> Path | None:
    layout = detect_cgroups(root=f"sluice-probe-{os.getpid()}")
    parent = layout.cpu_parent if layout.kind is CgroupKind.V1 else None
    if parent is not None:
        remove_root(parent.name)
    return parent.parent if parent is not None else None


def test_two_embedded_planes_at_once_get_separate_cgroup_roots_removed_on_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = _v1_cpu()
    if mount is None:
        pytest.skip("needs a writable cgroup v1 cpu hierarchy")
    monkeypatch.delenv("SLUICE_CGROUP_ROOT", raising=False)  # the test session's (tests/conftest.py)
    with (
        embedded_plane(tmp_path / "a", "kube", virtual_nodes=2) as a,
        embedded_plane(tmp_path / "b", "kube", virtual_nodes=2) as b,
    ):
        roots = [p.settings.cgroup_root for p in (a, b)]
        assert roots[0] != roots[1]
        for root in roots:
            assert root is not None and root.startswith(f"sluice-embedded-{os.getpid()}-")
            assert (mount / root / "node-0").is_dir(), f"node-0's cpu group is not under {root}"
    for root in roots:
        assert not (mount / root).exists(), f"{root} was left behind"


def test_remove_root_refuses_a_path_outside_the_mount() -> None:
    for bad in ("", "/etc", "a/../../b"):
        with pytest.raises(ValueError):
            remove_root(bad)
