"""Named failure points: make the job book fail on purpose at an exact step.

In the spirit of etcd's gofail: the book calls `hit(name)` just before and just after each
write to the store. Unarmed (the default) a hit costs one dict lookup. Tests arm a point to
show that a crash there loses no acknowledged write, duplicates no job and resurrects none:

- `raise`: raise `FailpointCrash` (a BaseException, so no `except Exception` in the round
  swallows it — it unwinds like the process dying there); the test then builds a new
  controller on the same store, as a restarted control plane would.
- `exit`: end the process at once with status 86 (`os._exit`, no clean-up), for tests that
  run a real control-plane process (`SLUICE_FAILPOINTS=book.transition.after_write=exit`).

An armed point fires once, at its `nth` hit (default: the first), then disarms itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

POINTS = (
    "book.create.before_write",
    "book.create.after_write",
    "book.transition.before_write",
    "book.transition.after_write",
    "book.flush.before_write",
    "book.flush.after_write",
)
"""Every point the book offers; arming another name is an error (a typo would test nothing)."""

EXIT_STATUS = 86


class FailpointCrash(BaseException):
    """Raised at an armed `raise` point. A BaseException on purpose: see the module docstring."""


@dataclass
class Failpoints:
    armed: dict[str, tuple[str, int]] = field(default_factory=dict)
    """point -> (action, hits still to pass before it fires)."""

    @classmethod
    def parse(cls, spec: str) -> Failpoints:
        """From `name=action[@nth],name=action` (the SLUICE_FAILPOINTS setting)."""
        fp = cls()
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, _, rest = item.partition("=")
            action, _, nth = (rest or "raise").partition("@")
            fp.arm(name.strip(), action.strip(), int(nth) if nth else 1)
        return fp

    def arm(self, name: str, action: str = "raise", nth: int = 1) -> None:
        if name not in POINTS:
            raise ValueError(f"failpoints: unknown point {name!r}; known: {', '.join(POINTS)}")
        if action not in ("raise", "exit"):
            raise ValueError(f"failpoints: action for {name} must be raise or exit, not {action!r}")
        if nth < 1:
            raise ValueError(f"failpoints: {name} fires at hit 1 or later, not {nth}")
        self.armed[name] = (action, nth - 1)

    def hit(self, name: str) -> None:
        got = self.armed.get(name)
        if got is None:
            return
        action, skip = got
        if skip > 0:
            self.armed[name] = (action, skip - 1)
            return
        del self.armed[name]
        if action == "exit":
            os._exit(EXIT_STATUS)
        raise FailpointCrash(name)
