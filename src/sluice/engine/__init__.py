"""Engines carry decisions out on real (or simulated) resources. An engine never decides."""

from sluice.engine.base import Engine, LaunchRequest, NodeInfo

__all__ = ["Engine", "LaunchRequest", "NodeInfo"]
