"""The one deadline a solve passes down to every step, heuristic and engine it runs.

A `Deadline` is an instant on `time.perf_counter()`'s clock, in seconds. Work is cut into
shares of it (`share`, `within`), never given a clock of its own, so that a solve given
`time_limit` seconds ends when they are spent whatever it is doing then.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadline:
    """The instant `at` (seconds on `time.perf_counter()`) by which work must end."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """The deadline `seconds` from now."""
        return cls(time.perf_counter() + seconds)

    def remaining(self) -> float:
        """Seconds left, 0.0 once it has passed."""
        return max(0.0, self.at - time.perf_counter())

    def passed(self) -> bool:
        """Whether the instant has come."""
        return time.perf_counter() >= self.at

    def within(self, seconds: float) -> Deadline:
        """The earlier of this deadline and `seconds` from now."""
        return Deadline(min(self.at, time.perf_counter() + seconds))

    def share(self, fraction: float) -> Deadline:
        """The instant when `fraction` (0..1) of the time remaining now will have passed."""
        return self.within(fraction * self.remaining())


NEVER = Deadline(math.inf)
"""No deadline: the work runs to completion."""
