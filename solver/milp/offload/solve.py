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
from solver.milp.cpsat import Progress, ProgressFn, configured_solver
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
    solver = configured_solver(deadline, len(model.m.proto.variables), workers)
    if solver is None:
        return OffloadResult("UNKNOWN", None, None, 0)
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
