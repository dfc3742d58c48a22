"""The exact offload model as a step of an offload solve (`solver.exact.offload.search`): how
large a model the time left allows, why one is not built, the incumbent as the model's cap, the
model's outcome checked against the simulator, and the errors where it proves or finds nothing.
"""

from __future__ import annotations

import math

from solver.core.budget import human_bytes
from solver.core.schedule import Schedule
from solver.errors import InfeasibleBudgetError, InternalError, SolverTimeoutError
from solver.exact.options import SolveOptions
from solver.heuristics.offload import OffloadRun
from solver.milp.cpsat import ProgressFn
from solver.milp.offload.solve import OffloadResult
from solver.milp.offload.times import OffloadTimes


def offload_model_room(options: SolveOptions, seconds: float) -> int:
    """The most variables an offload model may have to be built and solved in `seconds`: as
    for the stage model (`solver.exact.stage_model`), `SolveOptions.model_variables_per_second`
    per second, at most `SolveOptions.max_model_variables` (building one takes about half of
    that time: 21,000 variables per second on `benchmarks.zoo.resnet50`'s module graph)."""
    return min(options.max_model_variables, int(options.model_variables_per_second * seconds))


def too_large(size: int, room: int, left: float, options: SolveOptions) -> str:
    """Why an offload model of more than `room` variables (`size`, counted up to
    `max_model_variables`) is not built with `left` seconds left."""
    if size > options.max_model_variables:
        return (
            f"the exact offload model would have more than {options.max_model_variables} "
            "variables (SolveOptions.max_model_variables; it grows as the square of the nodes): "
            "solve a smaller graph (graph_capture granularity='module', or a part of the model)"
        )
    return (
        f"the exact offload model would have more than {room} variables, too many for the "
        f"{left:.1f} s left (SolveOptions.model_variables_per_second = "
        f"{options.model_variables_per_second}); raise the time limit"
    )


def model_units(run: OffloadRun, times: OffloadTimes) -> int:
    """The least T of `run`'s plan in the model, or more: its simulated cost in the model's
    units (rounded up), plus a unit per op where the times were rounded."""
    units = run.cost * times.units.scale if times.units.scale else run.cost / times.units.unit
    return math.ceil(units - 1e-6) + (0 if times.exact else len(run.ops))


def slack(schedule: Schedule) -> float:
    """How much cheaper than the incumbent CP-SAT's schedule must be to count as cheaper: a
    billionth of its cost (the simulator sums floats)."""
    return 1e-9 * max(1.0, abs(schedule.cost))


def check_accounting(schedule: Schedule, objective: int | None, times: OffloadTimes) -> None:
    """The simulator's cost of the model's plan is at most the model's objective (its least
    timeline; equal where CP-SAT proved it), to the rounding of the units."""
    assert objective is not None
    model = times.units.to_graph(objective)
    slack = 0.0 if times.exact else len(schedule.ops) * times.units.to_graph(1)
    tolerance = 1e-9 * max(1.0, abs(model)) + slack
    proven = schedule.status == "OPTIMAL"
    if schedule.cost > model + tolerance or (proven and schedule.cost < model - tolerance):
        raise InternalError(
            f"the offload model's timeline ({model:g}) disagrees with the simulator's "
            f"({schedule.cost:g})"
        )


def check_feasible(result: OffloadResult, cap: int | None, budget: int, floor: int) -> None:
    """InfeasibleBudgetError where CP-SAT proved that no schedule with offload fits `budget`
    bytes (`floor`: the one-line floor, the lower bound it names); InternalError where it
    refutes the incumbent's own cost `cap`."""
    if result.status == "INFEASIBLE" and cap is not None:
        raise InternalError("the offload model refutes the incumbent's own cost")
    if result.status == "INFEASIBLE":
        raise InfeasibleBudgetError(
            f"no schedule with offload fits a budget of {budget} bytes "
            f"({human_bytes(budget)}) over this link (proven in the stage space with "
            "offload, docs/offload.md); raise the budget",
            minimum_bytes=None,
            lower_bound_bytes=floor,
        )


def nothing_found(
    runs: list[OffloadRun], budget: int, no_model: str, bound: float
) -> SolverTimeoutError:
    """The error where neither the heuristics (`runs`) nor the model (`no_model`: why it found
    none) found a schedule within `budget` bytes in time; `bound`: the proven cost bound."""
    peaks = [run.peak for run in runs if run.valid]
    reached = f"; the least peak the heuristics reach is {human_bytes(min(peaks))}" if peaks else ""
    return SolverTimeoutError(
        f"no schedule within {human_bytes(budget)} was found in the time limit, with "
        f"offload or without ({no_model}{reached}); raise the time limit (--time-limit) "
        "or the budget",
        cost_bound=bound,
    )


def in_graph_units(progress: ProgressFn, times: OffloadTimes) -> ProgressFn:
    """`progress` fed the model's (seconds, objective, bound) in graph units."""

    def report(seconds: float, objective: float, bound: float) -> None:
        graph_bound = times.units.to_graph(bound) if math.isfinite(bound) else bound
        progress(seconds, times.units.to_graph(objective), graph_bound)

    return report
