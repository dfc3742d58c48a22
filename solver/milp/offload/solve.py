"""Solving the exact offload model (`solver.milp.offload.model`) with CP-SAT by a deadline:
its parameters, the time kept in hand for CP-SAT's overrun, and what a solve found
(`OffloadResult`)."""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from solver.core.graph import Problem
from solver.core.link import Link
from solver.core.offload import OffloadPlan
from solver.deadline import Deadline
from solver.errors import InternalError
from solver.milp.cpsat import OVERRUN_PER_VARIABLE, OVERRUN_SHARE, Progress, ProgressFn
from solver.milp.offload.model import OffloadModel
from solver.milp.offload.times import OffloadTimes


@dataclass(frozen=True)
class OffloadResult:
    """A solve of the model: status ("OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN"), the plan
    found (None without one), its objective and CP-SAT's bound, in the model's units."""

    status: str
    plan: OffloadPlan | None
    objective: int | None
    bound: int


@dataclass(frozen=True)
class Incumbent:
    """What a solve of the model starts from: at most `cap` units where given, a plan `hint`
    where given (`cap` must be at least its T)."""

    cap: int | None = None
    hint: OffloadPlan | None = None


def solve_offload_model(
    problem: Problem,
    budget: int,
    link: Link,
    times: OffloadTimes,
    *,
    deadline: Deadline,
    workers: int,
    incumbent: Incumbent = Incumbent(),
    progress: ProgressFn | None = None,
) -> OffloadResult:
    """Build the model and minimise T by `deadline`, from `incumbent`. `progress` gets
    (seconds, objective, bound) in model units."""
    cap, hint = incumbent.cap, incumbent.hint
    try:
        model = OffloadModel(problem, budget, link, times, cap, deadline)
    except TimeoutError:
        return OffloadResult("UNKNOWN", None, None, 0)
    if hint is not None:
        model.hint(hint)
    invalid = model.m.validate()
    if invalid:
        raise InternalError(f"the offload model is invalid ({invalid})")
    left = deadline.remaining()
    overrun = OVERRUN_PER_VARIABLE * len(model.m.proto.variables) + OVERRUN_SHARE * left
    if left <= overrun:
        return OffloadResult("UNKNOWN", None, None, 0)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = left - overrun
    solver.parameters.num_workers = workers
    # as for the stage model (`solver.milp.cpsat`): one presolve pass without probing (the full
    # presolve's dual strengthening took 10 s of VGG16's 90% solve), linearised rows for the LP
    solver.parameters.linearization_level = 2
    solver.parameters.max_presolve_iterations = 1
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.catch_sigint_signal = False
    callback = Progress(progress) if progress else None
    with deadline.on_stop(solver.stop_search):
        status = solver.solve(model.m, callback)
    name = solver.status_name(status)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        objective = round(solver.objective_value)
        bound = objective if name == "OPTIMAL" else _whole_bound(solver.best_objective_bound)
        return OffloadResult(name, model.plan(solver), objective, bound)
    bound = _whole_bound(solver.best_objective_bound) if name == "UNKNOWN" else 0
    return OffloadResult(name, None, None, bound)


def _whole_bound(bound: float) -> int:
    """CP-SAT's bound (a whole number handed over as a float) as an int; 0 where not finite."""
    return max(0, round(bound)) if bound == bound and abs(bound) < 2**62 else 0
