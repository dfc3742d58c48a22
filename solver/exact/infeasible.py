"""The error for a byte budget that no schedule fits, naming the least feasible peak."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import NoReturn

from solver.core.budget import human_bytes, percent_of
from solver.core.graph import Problem
from solver.errors import InfeasibleBudgetError
from solver.exact import least_peak
from solver.exact.state import Goal, Search, run_steps


def held(problem: Problem) -> str:
    """The error's clause ", of which N bytes are held beside the values at every op (parts)"
    where `problem` has such bytes (`Problem.held`): every schedule's peak includes them, so
    the least peak is the least of the values and op workspaces alone plus N (docs/executor.md,
    "The byte budget"); "" where it has none."""
    total = sum(b for _, b in problem.held)
    if not total:
        return ""
    parts = ", ".join(f"{name} {b}" for name, b in problem.held if b)
    return f", of which {total} bytes are held beside the values at every op ({parts})"


def raise_infeasible(search: Search) -> NoReturn:
    """Raise `InfeasibleBudgetError` for `search`'s budget. The least feasible peak is searched
    for (objective "memory", `solver.exact.least_peak.STEPS`) in what is left of the same
    deadline (NOTE [deadline]); the message names it, proven or within the bounds found."""
    budget = search.goal.budget
    assert budget is not None
    lower = search.problem.memory_lower_bound
    memory = replace(
        search,
        goal=Goal("memory", search.units),
        report=None,
        incumbent=None,
        floor=0,
        pending={},
        model=None,
        model_limit=None,
        lp=None,
        trace=[],
        notes={},
        lock=threading.RLock(),
    )
    memory = run_steps(least_peak.begin(memory), least_peak.STEPS)
    assert memory.incumbent is not None  # begin offers checkpoint-all, which fits
    peak = memory.incumbent.schedule.peak
    if memory.closed:
        minimum, what = peak, f"the minimum feasible budget is {peak} bytes"
    else:
        minimum = None
        what = (
            f"the minimum feasible budget is between {memory.floor} and {peak} bytes (not "
            "proven within the time limit)"
        )
    raise InfeasibleBudgetError(
        f"no schedule fits a budget of {budget} bytes ({human_bytes(budget)}): {what} "
        f"({human_bytes(peak)}, {percent_of(peak, search.problem)}){held(search.problem)}; "
        "raise the budget to at least that",
        minimum_bytes=minimum,
        lower_bound_bytes=max(lower, memory.floor),
    )
