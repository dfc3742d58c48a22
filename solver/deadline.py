"""The one deadline a solve passes down to every step, heuristic and engine it runs.

A `Deadline` is an instant on `time.perf_counter()`'s clock, in seconds, and optionally a `Stop`:
a request to end now (the first Ctrl-C, `solver.interrupt`) that every share of the deadline
sees. Work is cut into shares of it (`share`, `within`, `until`), never given a clock of its
own, so that a solve given `time_limit` seconds ends when they are spent or when it is stopped,
whatever it is doing then. Python loops poll `passed` or `leaves`; an engine running outside
Python registers how to stop it for as long as it runs (`on_stop`).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from solver.errors import ArgumentError, DeadlineError, RematError


class Stop:
    """A request to end work now, made once from any thread (`request`) and seen by every
    deadline holding it. The callbacks registered by running engines (`on_stop`) are called
    once: when it is requested, or at once if it was requested before they registered.

    `mark` requests it without calling them and takes no lock, for a signal handler (it runs in
    the main thread between two bytecodes, possibly inside one of this object's locks); another
    thread then calls `request` to call them (`solver.interrupt`)."""

    def __init__(self) -> None:
        self._requested = False  # a plain attribute: read and written without a lock
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0

    def requested(self) -> bool:
        """Whether the stop has been requested (or marked)."""
        return self._requested

    def mark(self) -> None:
        """Request the stop without calling the callbacks; lock-free (class docstring)."""
        self._requested = True

    def request(self) -> None:
        """Request the stop and call every registered callback not called yet (idempotent)."""
        with self._lock:
            self._requested = True
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for callback in callbacks:
            callback()

    @contextlib.contextmanager
    def calling(self, callback: Callable[[], None]) -> Iterator[None]:
        """Call `callback` (from the requesting thread) if the stop is requested while the
        block runs, or at once if it already was."""
        with self._lock:
            key, self._next = self._next, self._next + 1
            already = self._requested
            if not already:
                self._callbacks[key] = callback
        try:
            if already:
                callback()
            yield
        finally:
            with self._lock:
                self._callbacks.pop(key, None)


@dataclass(frozen=True)
class Deadline:
    """The instant `at` (seconds on `time.perf_counter()`) by which work must end, and the
    `stop` (None: none) that ends it sooner."""

    at: float
    stop: Stop | None = field(default=None, compare=False)

    @classmethod
    def after(cls, seconds: float, stop: Stop | None = None) -> Deadline:
        """The deadline `seconds` from now."""
        return cls(time.perf_counter() + seconds, stop)

    def stopped(self) -> bool:
        """Whether its stop has been requested."""
        return self.stop is not None and self.stop.requested()

    def remaining(self) -> float:
        """Seconds left, 0.0 once it has passed or been stopped."""
        return 0.0 if self.stopped() else max(0.0, self.at - time.perf_counter())

    def passed(self) -> bool:
        """Whether the instant has come or the stop has been requested."""
        return self.stopped() or time.perf_counter() >= self.at

    def check(self, before: str) -> None:
        """Raise DeadlineError, naming the work it comes `before` ("the trace"), where the
        deadline has passed: a piece of work that cannot end early checks before it begins."""
        if self.passed():
            raise DeadlineError(f"the deadline passed before {before}")

    def leaves(self, seconds: float) -> bool:
        """Whether `seconds` more of work would end by the deadline (False once stopped)."""
        return not self.stopped() and time.perf_counter() + seconds <= self.at

    def until(self, at: float) -> Deadline:
        """The earlier of this deadline and the instant `at`, with the same stop."""
        return Deadline(min(self.at, at), self.stop)

    def within(self, seconds: float) -> Deadline:
        """The earlier of this deadline and `seconds` from now."""
        return self.until(time.perf_counter() + seconds)

    def share(self, fraction: float) -> Deadline:
        """The instant when `fraction` (0..1) of the time remaining now will have passed."""
        return self.within(fraction * self.remaining())

    def on_stop(self, callback: Callable[[], None]) -> contextlib.AbstractContextManager:
        """A context in which a stop request calls `callback` (an engine's cancel), at once if
        it was requested already; nothing where the deadline has no stop."""
        return contextlib.nullcontext() if self.stop is None else self.stop.calling(callback)


class Paced:
    """Work done in parts of known sizes (`work[k]`: any unit proportional to its time, e.g. a
    model stage's variables) by `deadline`: `check(k)` before part k raises DeadlineError where
    `reserve` seconds (what must follow the work) would not end by the deadline or, past 5% of
    the work, where the rate so far says that the rest and `reserve` would not. `begin()` checks
    the reserve alone, before any part (for set-up that precedes part 0)."""

    def __init__(self, work: Sequence[int], deadline: Deadline, reserve: float = 0.0) -> None:
        self.deadline, self.reserve, self.began = deadline, reserve, time.perf_counter()
        self.work = list(work)
        self.total, self.done = sum(self.work), 0

    def begin(self) -> None:
        """Raise DeadlineError where `reserve` alone would not end by the deadline."""
        self._check_rest(0.0, "before its first part")

    def check(self, k: int) -> None:
        """Raise DeadlineError before part k unless the rest can be done in time."""
        done, left = self.done, self.total - self.done
        measured = done > 0.05 * self.total  # a rate from fewer parts is noise
        rest = (time.perf_counter() - self.began) * left / done if measured else 0.0
        self._check_rest(rest, f"part {k} of {len(self.work)}")
        self.done += self.work[k]

    def _check_rest(self, rest: float, where: str) -> None:
        """Raise DeadlineError unless `rest` seconds and the reserve end by the deadline."""
        if not self.deadline.leaves(rest + self.reserve):
            raise DeadlineError(f"the model would not be built by the deadline ({where})")


NEVER = Deadline(math.inf)
"""No deadline: the work runs to completion."""


def check_time_limit(time_limit: object, error: type[RematError] = ArgumentError) -> None:
    """Refuse, as `error` (the caller's class), a `time_limit` that is not a positive number of
    seconds (0, negative, NaN, not a number): one message for every call that takes one."""
    number = isinstance(time_limit, int | float) and not isinstance(time_limit, bool)
    if not (number and time_limit > 0):
        raise error(f"time_limit must be a positive number of seconds, not {time_limit!r}")


def process_start() -> float | None:
    """The instant this process began, on `time.perf_counter()`'s clock (seconds), so that a
    command's time limit counts its interpreter's start and imports; None where the system
    does not say (not Linux). Read from /proc/self/stat (start time in clock ticks since
    boot) against CLOCK_BOOTTIME: 10 ms resolution."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, counted after the command's name (fields 1-2)
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        elapsed = since_boot - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError, IndexError):
        return None
    return time.perf_counter() - elapsed if 0.0 <= elapsed < 86_400.0 else None
