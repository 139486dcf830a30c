"""The Policy protocol.

A policy may keep small private state between calls (FlowCon's per-job growth state, the
time of its last re-allocation); it must survive losing that state (after a control-plane
restart it starts afresh), and it never touches anything outside the view it is given.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sluice.model import ClusterView, Decision


@runtime_checkable
class Policy(Protocol):
    name: str

    def decide(self, view: ClusterView) -> list[Decision]: ...
