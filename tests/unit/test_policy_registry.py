"""make_policy: names and options fail loudly; the plane's common options do not."""

from __future__ import annotations

import pytest

from sluice.bench.sim import VARIANTS
from sluice.policy.registry import POLICIES, make_policy


def test_every_policy_takes_the_planes_interval_or_drops_it() -> None:
    for name in POLICIES:
        assert make_policy(name, interval_s=5.0).name


def test_an_option_the_policy_does_not_take_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'busy_fraktion'"):
        make_policy("sluice", busy_fraktion=0.7)
    with pytest.raises(ValueError, match=r"kube.*'margin'"):
        make_policy("kube", margin=0.1)


def test_an_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="kube"):
        make_policy("kueue")


def test_every_benchmark_variant_builds() -> None:
    """A variant whose options drifted from its policy's parameters would fail here, not
    halfway through a long benchmark run."""
    for name, options in VARIANTS.values():
        make_policy(name, interval_s=60.0, **options)
