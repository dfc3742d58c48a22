"""The moment relaxation (`solver.milp.formulation`, (5')) as a step of the exact search.

The relaxation models the stages from the first one over the budget in checkpoint-all on, with
memory bounded only where each stage computes its own node: every schedule satisfies it, so
its bound is a floor, and its solution, completed without recomputation before that stage
(`solver.core.stages.complete_prefix`), is a plan that is optimal when it fits.
"""

from __future__ import annotations

from solver.core.stages import Member, complete_prefix, plan_to_ops
from solver.exact.infeasible import raise_infeasible
from solver.exact.state import Search
from solver.exact.warm_start import moment_first
from solver.milp.cpsat import CpSatModel
from solver.milp.formulation import build, variable_count
from solver.milp.plans import hint_values, plan_from_values


def moment_relaxation(search: Search) -> Search:
    """Step: where the first overflow comes late (`warm_start.moment_first`), the relaxation
    before the stage model, with the pending warm starts evaluated beside it."""
    if moment_first(search) and not search.moments_ran:
        search.beside(lambda: relax(search, search.first_tight))
    return search


def relax(search: Search, first: int) -> None:
    """CP-SAT on the moment relaxation from stage `first`, from the incumbent as a complete hint
    and under its cost as a cap (a model at that recompute limit), until the deadline: raises the
    floor to what it proves (NOTE [certificates]) and offers its plans. When a plan proven
    optimal for the relaxation does not fit, the stages where it exceeds the budget get their
    exact memory rows (and the model starts at the earliest of them) and the relaxation is
    solved again: each round is still a relaxation, so every bound holds, and each adds a stage
    whose memory is exact, so the rounds end; while a round has at most
    `SolveOptions.moment_max_variables` variables. Infeasible under the cap proves that nothing
    is cheaper than the incumbent, and without one that no schedule fits."""
    problem, budget, units = search.problem, search.goal.budget, search.units
    assert budget is not None
    search.moments_ran = True
    exact_stages: set[int] = set()
    rounds = []
    while not search.deadline.passed():
        limit = search.value
        moments = frozenset(range(first, problem.n)) - exact_stages
        shape = {"first_stage": first, "moment_stages": moments}
        size = variable_count(problem, units.int_cost, limit, **shape)
        if size > search.options.moment_max_variables:
            break
        try:
            lm = build(problem, budget, units.int_cost, limit, search.deadline, **shape)
        except TimeoutError:
            break
        incumbent = search.incumbent
        result = CpSatModel(lm).solve(
            deadline=search.deadline,
            workers=search.workers,
            hint=None if incumbent is None else hint_values(lm, problem, incumbent.plan),
            objective_cap=limit,
            progress=search.engine_progress(relaxation=True),
        )
        rounds.append({"first_stage": first, "exact_stages": len(exact_stages), "size": size})
        rounds[-1]["status"] = result.status
        if result.status == "INFEASIBLE" and limit is None:
            raise_infeasible(search)
        search.conclude(result, limit)
        if result.values is None:
            break
        plan = plan_from_values(lm, problem.n, result.values.__getitem__)
        plan = complete_prefix(problem, plan, first)
        found = Member("moment relaxation", plan, plan_to_ops(problem, plan))
        search.offer(found)
        over = {t for t, peak in enumerate(found.schedule.stage_peaks) if peak > budget}
        if not over or result.status != "OPTIMAL":
            break
        exact_stages |= over
        first = min(first, *over)  # a stage of the completed prefix: the model starts there
    search.note(moment_rounds=rounds)
