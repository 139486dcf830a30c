"""Runtime-aware small-file merging (Kang): probe first, merge only where loading stalls, and
keep a block size only if it measurably beats reading files one by one.

Pure bookkeeping — the reader feeds it measurements and asks which setting to use next.
Setting 0 means "no merging"; any other value is a target block size in bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Trial:
    setting: int
    items: int = 0
    seconds: float = 0.0
    stall_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def stall_per_item(self) -> float:
        return self.stall_s / self.items if self.items else 0.0

    @property
    def stall_fraction(self) -> float:
        return self.stall_s / self.seconds if self.seconds > 0 else 0.0


@dataclass
class MergeTuner:
    candidates: Sequence[int]
    stall_threshold: float = 0.05
    probe_items: int = 256
    margin: float = 1.10
    """A block size must beat no-merging by this factor to be kept (noise must not flip it)."""
    trials: list[Trial] = field(default_factory=list)
    decided: int | None = None
    reason: str = ""

    def current(self) -> int:
        if self.decided is not None:
            return self.decided
        if not self.trials:
            self.trials.append(Trial(0))
        return self.trials[-1].setting

    def record(self, items: int, seconds: float, stall_s: float) -> None:
        """Measurements of the current setting; moves to the next trial once a probe is full."""
        if self.decided is not None:
            return
        t = self.trials[-1] if self.trials else Trial(0)
        if not self.trials:
            self.trials.append(t)
        t.items += items
        t.seconds += seconds
        t.stall_s += stall_s
        if t.items < self.probe_items:
            return
        base = self.trials[0]
        if t is base and base.stall_fraction < self.stall_threshold:
            self.decided = 0
            self.reason = f"loading does not stall ({base.stall_fraction:.1%} of the time); not merging"
            return
        tried = {x.setting for x in self.trials}
        left = [c for c in self.candidates if c not in tried]
        if left:
            self.trials.append(Trial(left[0]))
            return
        best = max(self.trials[1:], key=lambda x: x.rate, default=base)
        if best.rate > base.rate * self.margin and best.stall_per_item * self.margin < base.stall_per_item:
            self.decided = best.setting
            self.reason = (
                f"merging into {best.setting // 1024} KiB blocks: {best.rate:.0f} items/s vs {base.rate:.0f} unmerged"
            )
        else:
            self.decided = 0
            self.reason = f"no block size beat unmerged reads by {self.margin - 1:.0%}; not merging"
