"""Measured peak memory and step time, for the executor's users (`measure_peak` lives in
`graph_capture.measurement.peak`, which capture uses to measure each op's transient bytes,
`median_seconds` in `graph_capture.measurement.timing`)."""

from __future__ import annotations

from graph_capture.measurement.peak import PeakMemory, measure_peak
from graph_capture.measurement.timing import median_seconds

__all__ = ["PeakMemory", "measure_peak", "median_seconds"]
