"""Steps: where a search at a byte budget begins (objective "cost").

`begin` settles the trivial cases: checkpoint-all is the first incumbent, and where it fits
the search is closed at once (no schedule costs less than computing every node once); a budget
below the peak floor (`Problem.memory_lower_bound`) fits no schedule. `warm_start` then
offers the heuristics run at the budget (NOTE [incumbent] in `solver.exact.state`).
"""

from __future__ import annotations

from solver.core.stages import Member, plan_from_keep, plan_to_ops
from solver.exact.infeasible import raise_infeasible
from solver.exact.state import Search
from solver.heuristics.backward import backward_runs
from solver.heuristics.eviction import eviction_runs
from solver.heuristics.eviction_search import peak_search
from solver.heuristics.least_peak import least_peak
from solver.heuristics.registry import HEURISTICS, cheapest_policy
from solver.milp.formulation import variable_count


def begin(search: Search) -> Search:
    """Offer checkpoint-all (every node once, each freed after its last user), which closes the
    search where it fits; raise `InfeasibleBudgetError` for a budget below the peak floor;
    record the first stage over the budget (`Search.first_tight`)."""
    problem, budget = search.problem, search.goal.budget
    plan = plan_from_keep(problem, range(problem.n))
    everything = plan_to_ops(problem, plan)
    search.offer(Member("checkpoint-all", plan, everything))
    if search.closed or budget is None:
        return search
    if budget < problem.memory_lower_bound:
        raise_infeasible(search)
    search.first_tight = min(t for t, peak in enumerate(everything.stage_peaks) if peak > budget)
    return search


def moment_first(search: Search) -> bool:
    """Whether the moment relaxation runs before the stage model: the first stage over the
    budget comes late (`SolveOptions.moment_late_share`), so the relaxation, which models the
    stages from there on only, is small (`solver.exact.moments`)."""
    return search.first_tight >= search.options.moment_late_share * search.problem.n


def small_model(search: Search) -> bool:
    """Whether the stage model at the incumbent's cost (every schedule's, without one) has at
    most `SolveOptions.cascade_small_model` variables: small enough for the steps that search
    it (the moment relaxation, the LP's roundings, the probes). Counted only on graphs of at
    most SMALL_GRAPH nodes, where counting is quick: larger ones are never that small."""
    problem = search.problem
    if problem.n > SMALL_GRAPH:
        return False
    size = variable_count(problem, search.units.int_cost, search.value)
    return size <= search.options.cascade_small_model


SMALL_GRAPH = 400
"""Nodes above which `small_model` does not count the stage model's variables."""


def warm_start(search: Search) -> Search:
    """Step: the heuristics at the budget that `SolveOptions.warm_starts` names, within
    `TimeShares.warm_start` of the limit. Eviction runs first (fast, and on the published graphs
    within 0.1% of the optimum); per-block checkpointing (`module_blocks`), the other checkpoint
    policies, then the backward searches, wait in `Search.pending` for the next engine call
    (evaluated beside it, on the other core), unless nothing before them fits or (the backward
    searches) the moment relaxation runs first (it takes the incumbent's cost as its cap, so the
    cheapest incumbent pays there). Where nothing fits, the least-peak search over the
    heuristics waits there too (`_least_peak_run`)."""
    problem, budget, names = search.problem, search.goal.budget, search.options.warm_starts
    assert budget is not None
    deadline = search.share_of_limit(search.options.shares.warm_start)
    if "eviction" in names:
        search.offer(*eviction_runs(problem, budget, deadline))
    backward_now = "backward" in names and (search.incumbent is None or moment_first(search))
    if backward_now:
        search.offer(*backward_runs(problem, budget, deadline))
    if "policies" in names:
        if search.incumbent is None:  # with the costly family as a last resort
            search.offer(cheapest_policy(problem, budget, True, deadline))
        else:  # per-block checkpointing first: quick, and a start for the lifetime search
            others = [name for name in HEURISTICS if name != "module_blocks"]
            search.defer(
                "module_blocks",
                lambda: _listed(
                    cheapest_policy(problem, budget, False, deadline, ["module_blocks"])
                ),
            )
            search.defer(
                "policies",
                lambda: _listed(cheapest_policy(problem, budget, False, deadline, others)),
            )
    if "backward" in names and not backward_now:
        search.defer("backward", lambda: backward_runs(problem, budget, deadline))
    if search.incumbent is None and "eviction" in names:
        search.defer("least peak", lambda: _least_peak_run(search))
    return search


def _least_peak_run(search: Search) -> list[Member]:
    """Where no heuristic fits the budget: the least-peak search over the eviction and
    backward runs (`solver.heuristics.least_peak`, for `TimeShares.heuristic` of the
    limit from when it starts, beside the next engine call), then, where its run is an eviction
    run over the budget, the eviction search for lower peaks from it until one fits
    (`eviction_search.peak_search`, within `TimeShares.warm_start` of the limit, or
    `peak_search_small` where the stage model is small (`small_model`): the steps after
    the cascade cover wait for it, and there the moment relaxation and the LP's roundings give
    schedules). Its run is offered (a run at a lower byte budget may fit where the run at this
    one does not); where it does not fit either, its peak is kept for the error that says which
    budget the heuristics reach (`Search.heuristic_peak`)."""
    budget, options = search.goal.budget, search.options
    deadline = search.deadline.within(options.shares.heuristic * search.time_limit)
    run = least_peak(search.problem, None, deadline)
    if run is not None and run.eviction is not None and not search.goal.fits(run):
        small = small_model(search)
        share = options.shares.peak_search_small if small else options.shares.warm_start
        longer = search.deadline.within(share * search.time_limit)
        run = peak_search(search.problem, run, deadline=longer, enough=budget)
    if run is not None and not search.goal.fits(run):
        search.heuristic_peak = run.schedule.peak
    return [] if run is None else [run]


def _listed(member: Member | None) -> list[Member]:
    return [] if member is None else [member]
