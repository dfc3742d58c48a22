"""Measured peak memory and step time (`measure_peak` lives in `graph_capture.measurement.peak`,
which capture uses to measure each op's transient bytes; it is re-exported here for the executor's
users)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from graph_capture.measurement.peak import PeakMemory, measure_peak

__all__ = ["PeakMemory", "measure_peak", "median_seconds"]


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
