"""Steps: the stage model (`solver.milp.formulation`), its LP relaxation and the LP's roundings.

The model is built at the incumbent's recompute cost (`build`'s recompute limit: nodes costing
more are never recomputed, which shrinks it, and it still holds the incumbent and every better
schedule). Its LP relaxation (HiGHS, `solver.milp.lp`) gives a bound certified from its duals
(NOTE [certificates]) and the keep fractions that are rounded into schedules
(`solver.heuristics.rounding`, and an eviction run that evicts what the LP keeps least).
"""

from __future__ import annotations

from functools import partial

from solver.deadline import Deadline
from solver.exact.state import Search
from solver.heuristics.eviction import evict_by_keep
from solver.heuristics.rounding import rounded_members
from solver.milp.formulation import build, variable_count
from solver.milp.lp import solve_relaxation


def stage_model(search: Search) -> Search:
    """Step: build the stage model at the incumbent's cost (no limit without one), unless it
    would have more than `SolveOptions.max_model_variables` variables, or more than
    `SolveOptions.model_variables_per_second` per second left, or is not built by the
    deadline (`Search.no_model` then says why, and the later steps have nothing to solve)."""
    problem, budget, units = search.problem, search.goal.budget, search.units
    limit = search.value
    options, left = search.options, search.deadline.remaining()
    room = min(options.max_model_variables, int(options.model_variables_per_second * left))
    size = variable_count(problem, units.int_cost, limit, above=room)
    search.note(variables=size)  # counted up to `room` only: more than that when over it
    if size > options.max_model_variables:
        search.no_model = (
            f"the exact model of this graph would have more than {options.max_model_variables} "
            "variables (SolveOptions.max_model_variables); raise the budget, or capture the "
            "model coarser (graph_capture granularity='module')"
        )
        return search
    if size > room:
        search.no_model = (
            f"the exact model would have more than {room} variables, too many for the "
            f"{left:.1f} s left (SolveOptions.model_variables_per_second = "
            f"{options.model_variables_per_second}); raise the time limit"
        )
        return search
    try:
        search.model = build(problem, budget, units.int_cost, limit, search.deadline)
    except TimeoutError:
        search.no_model = f"the exact model was not built within {search.time_limit:g} s"
        return search
    search.model_limit = limit
    return search


def lp_deadline(search: Search) -> Deadline:
    """When an LP relaxation must end: `TimeShares.lp` of the remaining time."""
    return search.deadline.share(search.options.shares.lp)


def lp_relaxation(search: Search) -> Search:
    """Step: the model's LP relaxation (within `TimeShares.lp` of the remaining time,
    beside the pending warm starts): its bound raises the floor and its roundings are offered.
    While a rounding beats the incumbent, an LP takes under `TimeShares.lp_repeat` of the remaining
    time and the new incumbent's cost shrinks the model, the model is rebuilt there and its LP
    solved again (another LP optimum, another rounding)."""
    problem, budget, units, options = (
        search.problem,
        search.goal.budget,
        search.units,
        search.options,
    )
    assert budget is not None
    rounds = 0
    while search.model is not None:
        began = search.elapsed()
        model = search.model
        search.lp = search.beside(partial(solve_relaxation, model, lp_deadline(search)))
        rounds += 1
        if search.lp is None:
            break
        cap = search.model_limit
        search.raise_floor(search.lp.bound if cap is None else min(search.lp.bound, cap + 1))
        if search.closed or not options.rounding:
            break
        values = search.lp.values
        assert values is not None
        fractions = [{i: values[v] for i, v in stage.items()} for stage in model.keep]
        before = search.value
        search.offer(
            *rounded_members(problem, fractions, search.deadline),
            evict_by_keep(problem, budget, fractions, search.deadline),
        )
        limit = search.value
        if limit is None or (before is not None and limit >= before):
            break
        if search.elapsed() - began > options.shares.lp_repeat * search.deadline.remaining():
            break
        size = len(model.names)
        if variable_count(problem, units.int_cost, limit, above=size) == size:
            break  # the same model less a slack limit row: the same LP optimum and rounding
        try:
            search.model = build(problem, budget, units.int_cost, limit, search.deadline)
        except TimeoutError:
            break
        search.model_limit, search.lp = limit, None
    search.note(lp_rounds=rounds, lp_bound=None if search.lp is None else search.lp.base)
    return search
