"""Run a traced training step under a solved rematerialization schedule.

    rm = executor.rematerialize(model, example_inputs, "50%", time_limit=60)  # capture, solve
    rm = executor.Rematerialized.load("schedule.json", model, example_inputs)  # solved offline
    loss_fn(rm(*inputs)).backward(); optimizer.step()                  # bit-identical to eager
    plan = executor.checkpoint_plan(model, example_inputs, "50%", loss_fn=loss_fn, time_limit=60)
    cm = executor.compile(model, inputs, "50%")  # inductor, remat's partition
    found = executor.fit(factory, "24GiB", dim="batch", compute_budget=1.3)  # the largest batch
    fsdp = executor.fsdp_policy(8, "h100", param_dtype="bfloat16")  # fsdp= of fit and plans

One interface: `example_inputs` a tuple or list, or one tensor; a budget read by
`solver.core.budget.Budget`: a percentage is of the measured plain step's peak, "min" the
least peak then the least recompute at it, a bare memory number bytes, a bare compute number a
factor of computing every node once; `time_limit` bounds the whole call (a positive number of
seconds) and the first Ctrl-C ends it with the best found (`solver.interrupt.call_deadline`);
`obj.save(path)` and `X.load(path, what it belongs to...)` (`Rematerialized`,
`CheckpointPlan`, `CompiledModel`: the schedule(s) with the fingerprint of what they belong
to, another model's file refused in one line); `loss_fn(output) -> scalar` with
`executor.default_loss` (`output.loss`, or a scalar output) where a step is planned.

See docs/executor.md for the forward/backward split, RNG replay, BatchNorm statistics and how
peak memory is measured.
"""

import graph_capture.torch_range  # noqa: F401  (first: refuses an unsupported torch in one line)

# isort: split
from executor.compiled import CompileCheck, CompiledModel, CompileReport, compile
from executor.errors import (
    AutocastMismatchError,
    BackwardError,
    CompileError,
    ExecutorError,
    FitError,
    InputMismatchError,
    OpStreamMismatchError,
    PlanError,
    RematerializeError,
    UnsupportedScheduleError,
    UnusedOutputGradientError,
)
from executor.estimation import StepEstimate, StrategyEstimate, estimate
from executor.fitting.api import fit
from executor.fsdp import FsdpPolicy, fsdp_policy
from executor.loss import default_loss
from executor.memory import PeakMemory, measure_peak, median_seconds
from executor.sac.plan import CheckpointPlan
from executor.sac.planning import checkpoint_plan
from executor.traced.estimated import EstimateCheck, EstimatedPeakWarning
from executor.traced.module import Rematerialized
from executor.traced.rematerialize import rematerialize
from solver.fitting.result import Fit

__all__ = [
    "AutocastMismatchError",
    "BackwardError",
    "CheckpointPlan",
    "CompileCheck",
    "CompileError",
    "CompileReport",
    "CompiledModel",
    "EstimateCheck",
    "EstimatedPeakWarning",
    "ExecutorError",
    "Fit",
    "FitError",
    "FsdpPolicy",
    "InputMismatchError",
    "OpStreamMismatchError",
    "PeakMemory",
    "PlanError",
    "RematerializeError",
    "Rematerialized",
    "StepEstimate",
    "StrategyEstimate",
    "UnsupportedScheduleError",
    "UnusedOutputGradientError",
    "checkpoint_plan",
    "compile",
    "default_loss",
    "estimate",
    "fit",
    "fsdp_policy",
    "measure_peak",
    "median_seconds",
    "rematerialize",
]
