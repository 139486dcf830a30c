"""FakeClock: a clock a test moves by hand, for code that takes `clock=` (a fake, named so).

Time-based logic — grace periods, sample intervals, rates per second — is tested by moving
this clock, never by sleeping: the test is exact and takes no wall time.
"""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        assert seconds >= 0, "a clock never runs backwards"
        self.now += seconds
        return self.now
