"""What `sluice up` says when the network fence cannot be made: the one reason that holds.

A v2-only host without nft (session 23's GPU machine) was told "no v2 tree, or no nft",
leaving the operator to guess which of the two to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.agent import net_fence as nf


def test_a_host_without_nft_is_told_to_install_it_whatever_its_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nf.shutil, "which", lambda name: None)
    for group, mount in ((None, None), (Path("/sys/fs/cgroup/x/n0"), Path("/sys/fs/cgroup"))):
        fence = nf.net_fence(group, mount)
        assert not fence.available
        assert fence.missing == "no nft command (apt-get install nftables)"


def test_with_nft_but_no_v2_group_the_groups_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nf.shutil, "which", lambda name: "/usr/sbin/nft")
    fence = nf.net_fence(None, None)
    assert not fence.available
    assert fence.missing.startswith("jobs have no cgroup v2 group of their own (no v2 tree")


def test_turned_off_says_so_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nf.shutil, "which", lambda name: None)
    assert nf.net_fence(None, None, enabled=False).missing == "turned off (setting net_fence=off)"
