"""Step: the read-gap cover (`solver.milp.cover`), a bound without the stage model."""

from __future__ import annotations

from solver.exact.state import Search
from solver.milp.cover import read_gap_cover as solve_cover


def read_gap_cover(search: Search) -> Search:
    """Step: solve the read-gap cover (CP-SAT, for at most `TimeShares.cover` of the
    time limit); its bound raises the floor (NOTE [certificates]: CP-SAT's, exact) and the plan
    its solution suggests is offered. On the published training graphs the bound is often the
    optimum and the plan reaches it, which closes the search with no stage model."""
    if not search.options.cover:
        return search
    budget = search.goal.budget
    assert budget is not None
    cover = solve_cover(
        search.problem,
        budget,
        search.units.int_cost,
        deadline=search.deadline.within(search.options.shares.cover * search.time_limit),
        workers=search.options.cover_workers,
    )
    search.raise_floor(cover.bound)
    search.offer(cover.member)
    search.note(bound=cover.bound)
    return search
