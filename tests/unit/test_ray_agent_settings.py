"""What of the plane's settings reaches a Ray node's agent (engine/ray.py AGENT_SETTINGS)."""

from __future__ import annotations

from pathlib import Path

from sluice.engine.ray import agent_settings_from
from sluice.settings import Settings


def test_the_plane_s_fence_settings_travel_to_every_ray_node(tmp_path: Path) -> None:
    """A plane's `*_fence: off` was ignored on Ray: the node agents rebuilt their settings
    from the carried fields (and the node's environment) and fenced anyway."""
    plane = Settings(home=tmp_path, gpu_fence="off", net_fence="off", unix_fence="off")
    carried = agent_settings_from(plane)
    node = Settings.model_validate({**carried, "home": tmp_path})
    assert (node.gpu_fence, node.net_fence, node.unix_fence) == ("off", "off", "off")
    assert carried["cgroup_root"] == plane.cgroup_root


def test_the_plane_s_disk_settings_travel_to_every_ray_node(tmp_path: Path) -> None:
    """A plane's disk_reserve_percent (0: off, or a larger reserve) and disk_check_s were not
    carried: every Ray node's agent watched with its own defaults (5 %, 15 s)."""
    plane = Settings(home=tmp_path, disk_check_s=2.5, disk_reserve_percent=0)
    node = Settings.model_validate({**agent_settings_from(plane), "home": tmp_path})
    assert (node.disk_check_s, node.disk_reserve_percent) == (2.5, 0)
