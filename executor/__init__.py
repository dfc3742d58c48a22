"""Run a traced training step under a solved rematerialization schedule.

    rm = executor.rematerialize(model, example_inputs, budget="50%")   # capture, solve, wrap
    rm = executor.Rematerialized.from_file(model, example_inputs, "schedule.json")
    found = executor.fit(factory, "24GiB", dim="batch", max_overhead=1.3)  # the largest batch
    loss = rm(*inputs); loss.backward(); optimizer.step()              # bit-identical to eager

See docs/executor.md for the forward/backward split, RNG replay, BatchNorm statistics and how
peak memory is measured.
"""

from executor.errors import (
    AutocastMismatchError,
    ExecutorError,
    FitError,
    InputMismatchError,
    OpStreamMismatchError,
    PlanError,
    UnsupportedScheduleError,
    UnusedOutputGradientError,
)
from executor.fitting import Fit, fit
from executor.memory import PeakMemory, measure_peak, median_seconds
from executor.module import Rematerialized, rematerialize
from executor.sac import CheckpointPlan, checkpoint_plan

__all__ = [
    "AutocastMismatchError",
    "CheckpointPlan",
    "ExecutorError",
    "Fit",
    "FitError",
    "InputMismatchError",
    "OpStreamMismatchError",
    "PeakMemory",
    "PlanError",
    "Rematerialized",
    "UnsupportedScheduleError",
    "UnusedOutputGradientError",
    "checkpoint_plan",
    "fit",
    "measure_peak",
    "median_seconds",
    "rematerialize",
]
