"""Steps of objective "memory": the schedule of least peak within a compute budget.

The floor starts at the peak floor (`Problem.memory_lower_bound`: computing some node needs
its output, its inputs and its transient bytes at once, and the input computed last was
computed beside the others, `solver.core.peak_floor`), so a heuristic that peaks there closes
the search at once. The model is the stage model with the peak as its objective and the compute
budget as its recompute limit, solved by CP-SAT from the best heuristic.
"""

from __future__ import annotations

from solver.core.stages import Member, plan_from_keep, plan_to_ops
from solver.errors import ComputeBudgetError
from solver.exact.state import Search
from solver.heuristics.eviction_search import peak_search
from solver.heuristics.least_peak import least_peak
from solver.heuristics.registry import all_policies
from solver.milp.cpsat import CpSatModel
from solver.milp.formulation import build, variable_count
from solver.milp.plans import hint_values, plan_from_values


def begin(search: Search) -> Search:
    """Refuse a compute budget below computing every node once; offer checkpoint-all (which
    fits every other); the floor is the peak floor."""
    problem, limit = search.problem, search.goal.compute_budget
    if limit is not None and limit < problem.total_cost * (1 - 1e-12):
        raise ComputeBudgetError(
            f"compute budget {limit:g} is below {problem.total_cost:g}, the cost of "
            "computing every node once; no schedule can fit (use a budget >= 1.0x)"
        )
    plan = plan_from_keep(problem, range(problem.n))
    search.offer(Member("checkpoint-all", plan, plan_to_ops(problem, plan)))
    search.raise_floor(problem.memory_lower_bound)
    return search


def heuristic_least_peak(search: Search) -> Search:
    """Step: the least-peak search over the heuristics run at a budget
    (`solver.heuristics.least_peak`), each run of a new least peak offered as it comes, within
    `TimeShares.heuristic` of the limit; where the stage model is too large to be built
    (`peak_model`), the search takes its time too, all but that share of the limit, which is
    left to the checkpoint policies (on a 24-layer Llama, 3,335 nodes, a tenth of 60 s bisected
    down to 26% of the checkpoint-all peak where eviction fits 3.3%)."""
    share = search.options.shares.heuristic
    if _model_size(search) > search.options.max_model_variables:
        share = 1 - share
    deadline = search.share_of_limit(share)
    least_peak(search.problem, search.goal.compute_budget, deadline, found=search.offer)
    return search


def checkpoint_policies(search: Search) -> Search:
    """Step: every checkpoint-policy member (the recompute-at-each-use family included: it is
    the least-memory end of the policies), for at most `TimeShares.policy` of the
    limit."""
    deadline = search.deadline.within(search.options.shares.policy * search.time_limit)
    search.offer(*all_policies(search.problem, deadline, each_use=True))
    return search


def peak_model(search: Search) -> Search:
    """Step: CP-SAT on the stage model with the peak as its objective, from the incumbent, for
    the rest of the time; skipped above `SolveOptions.max_model_variables` variables."""
    problem, units, incumbent = search.problem, search.units, search.incumbent
    assert incumbent is not None
    size = _model_size(search)
    search.note(variables=size)
    if size > search.options.max_model_variables:
        return search
    try:
        model = build(problem, None, units.int_cost, _recompute_limit(search), search.deadline)
    except TimeoutError:
        return search
    result = CpSatModel(model).solve(
        deadline=search.deadline,
        workers=search.workers,
        hint=hint_values(model, problem, incumbent.plan),
        progress=search.engine_progress(),
    )
    search.note(cpsat=result.status)
    if result.values is not None:
        plan = plan_from_values(model, problem.n, result.values.__getitem__)
        search.offer(Member("CP-SAT", plan, plan_to_ops(problem, plan)))
    if result.status != "INFEASIBLE":  # the model holds the incumbent: never infeasible
        search.conclude(result, None)
    return search


def eviction_peak_search(search: Search) -> Search:
    """Step, last: where the incumbent is an eviction run and time is left (the stage model was
    not built, or its CP-SAT ended), the eviction search for lower peaks from it
    (`solver.heuristics.eviction_search.peak_search`) until the deadline, each run offered."""
    incumbent, cap = search.incumbent, search.goal.compute_budget
    if incumbent is not None and incumbent.eviction is not None:
        cap = None if cap is None else cap * (1 + 1e-12)
        peak_search(
            search.problem, incumbent, deadline=search.deadline, cost_cap=cap, found=search.offer
        )
    return search


def _recompute_limit(search: Search) -> int | None:
    """The compute budget as the stage model's recompute limit (integer cost units above
    computing every node once), None without one."""
    units, budget = search.units, search.goal.compute_budget
    return None if budget is None else int(budget / units.unit + 1e-9) - units.first


def _model_size(search: Search) -> int:
    """Variables of the stage model `peak_model` would build."""
    return variable_count(search.problem, search.units.int_cost, _recompute_limit(search))


STEPS = (heuristic_least_peak, checkpoint_policies, peak_model, eviction_peak_search)
"""The steps of objective "memory", in order, after `begin`."""
