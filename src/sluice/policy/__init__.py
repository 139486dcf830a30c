"""Pure scheduling policies: a ClusterView in, decisions (with reasons) out. No I/O."""

from sluice.policy.base import Policy
from sluice.policy.registry import POLICIES, make_policy

__all__ = ["POLICIES", "Policy", "make_policy"]
