"""Policies by name. `make_policy` is how the controller, the CLI and the simulator get one."""

from __future__ import annotations

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


def make_policy(name: str | Policy, **options: Any) -> Policy:
    """The one place a policy is set up, for the control plane, the simulator and benchmarks.

    A name builds it; options it does not take are dropped (e.g. interval_s for kube). A
    policy object is returned as it is (a test's or a study's own).
    """
    if not isinstance(name, str):
        return name
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}") from None
    import inspect

    params = inspect.signature(factory).parameters
    return factory(**{k: v for k, v in options.items() if k in params})


def adapts_batch(policy: Policy) -> bool:
    """Whether a policy counts on GPU jobs adapting their batch size to their GPUs
    (AdaptDL-style): pollux and sluice, whose classes say so as `adaptive_batch = True`."""
    return isinstance(policy, PolluxPolicy | SluicePolicy)
