"""Policies by name. `make_policy` is how the controller, the CLI and the simulator get one."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from sluice.policy.base import Policy
from sluice.policy.binpack import BinpackPolicy
from sluice.policy.data_aware import DataAwarePolicy
from sluice.policy.dqoes import DQoESPolicy
from sluice.policy.fifo import FifoPolicy
from sluice.policy.flowcon import FlowConPolicy
from sluice.policy.kube import KubePolicy
from sluice.policy.optimus import OptimusPolicy
from sluice.policy.pollux import PolluxPolicy
from sluice.policy.sluice_policy import SluicePolicy
from sluice.policy.specon import SpeConPolicy
from sluice.policy.tiresias import TiresiasPolicy

POLICIES: dict[str, Callable[..., Policy]] = {
    "kube": KubePolicy,
    "flowcon": FlowConPolicy,
    "fifo": FifoPolicy,
    "binpack": BinpackPolicy,
    "data-aware": DataAwarePolicy,
    "tiresias": TiresiasPolicy,
    "optimus": OptimusPolicy,
    "pollux": PolluxPolicy,
    "sluice": SluicePolicy,
    "specon": SpeConPolicy,
    "dqoes": DQoESPolicy,
}

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "pollux-prior": ("pollux", {"learn_speedup": False}),
    "sluice-prior": ("sluice", {"learn_speedup": False}),
    "sluice-gns": ("sluice", {"carry_noise": True}),
}
"""Named variants: a registered policy with options changed, runnable by name wherever a policy
name is taken (`make_policy`). `-prior`: the fixed n^0.8 speed-up prior instead of curves
learned from each job's measured rates, to show what learning buys; `sluice-gns`: the learned
curves carried to each job's reported gradient noise scale (off by default, docs/policies.md).
Their options concern GPU jobs' speed-ups only: on CPU jobs a variant runs as its policy."""


def policy_names(variants: bool = True) -> list[str]:
    """Every name `make_policy` takes, sorted: the registered policies and (unless `variants`
    is false) their named variants. The one list the CLI, the server and benchmarks check against."""
    return sorted({*POLICIES, *VARIANTS}) if variants else sorted(POLICIES)


COMMON_OPTIONS = frozenset({"interval_s"})
"""Options the plane and the simulator hand every policy: a policy that has no use for them
(kube has no interval of its own) simply does not take them."""


def make_policy(name: str | Policy, **options: Any) -> Policy:
    """The one place a policy is set up, for the control plane, the simulator and benchmarks.

    A name builds it; a variant's name (VARIANTS) builds its policy with the variant's options,
    which options given here override. Of the options, the common ones (COMMON_OPTIONS) are dropped where the
    policy does not take them; any other option the policy does not take is a ValueError
    naming it, so a typo in a sweep or a benchmark variant fails instead of silently running
    the defaults. A policy object is returned as it is (a test's or a study's own).
    """
    if not isinstance(name, str):
        return name
    if name in VARIANTS:
        base, preset = VARIANTS[name]
        return make_policy(base, **{**preset, **options})
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(policy_names())}") from None
    params = inspect.signature(factory).parameters
    unknown = sorted(k for k in options if k not in params and k not in COMMON_OPTIONS)
    if unknown:
        takes = ", ".join(sorted(params)) or "none"
        raise ValueError(f"policy {name!r} takes no option {', '.join(map(repr, unknown))} (it takes: {takes})")
    return factory(**{k: v for k, v in options.items() if k in params})


def adapts_batch(policy: Policy) -> bool:
    """Whether a policy counts on GPU jobs adapting their batch size to their GPUs
    (AdaptDL-style): pollux and sluice, whose classes say so as `adaptive_batch = True`."""
    return isinstance(policy, PolluxPolicy | SluicePolicy)
