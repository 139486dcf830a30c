"""Scripted: the kube policy plus whatever decisions a test pushes for the next round — how
controller tests make the round execute a chosen decision without reaching into it."""

from __future__ import annotations

from sluice.model import ClusterView, Decision
from sluice.policy import make_policy


class Scripted:
    name = "scripted"

    def __init__(self) -> None:
        self.base = make_policy("kube")
        self.extra: list[Decision] = []

    def push(self, *ds: Decision) -> None:
        self.extra.extend(ds)

    def decide(self, view: ClusterView) -> list[Decision]:
        out, self.extra = [*self.base.decide(view), *self.extra], []
        return out
