"""The memory/compute frontier: the exact solver and every baseline over a list of budgets."""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from solver.core.budget import parse_budget
from solver.core.graph import prepare
from solver.errors import InfeasibleBudgetError, SolverTimeoutError
from solver.exact.pipeline import solve
from solver.heuristics.baselines import cheapest_within
from solver.heuristics.least_peak import BUDGETED
from solver.heuristics.registry import families


@dataclass(frozen=True)
class FrontierPoint:
    """One (method, budget) result. `cost`/`peak` are None when the method cannot fit the budget.

    budget and peak are bytes; cost is in the graph's cost unit; seconds is solve time.
    """

    method: str
    budget: int
    cost: float | None
    peak: int | None
    status: str
    gap: float | None
    seconds: float


def frontier(
    graph: nx.DiGraph,
    budgets: list[int | str],
    *,
    methods: list[str] | None = None,
    time_limit: float = 60.0,
    workers: int = 8,
) -> list[FrontierPoint]:
    """Solve every budget with the exact solver and each baseline (all by default).

    `methods` picks among "exact", the names in `solver.BASELINES`, "rotor" (training graphs
    of chains; see `solver.families`), "eviction" and "backward" (`solver.warm_start.BUDGETED`,
    run at each budget).
    Families are evaluated once and filtered per budget. A
    method that cannot fit a budget gives a point with status "INFEASIBLE" (exact: proven),
    "TIMEOUT" (exact: nothing found in time) or "NO FIT" (heuristic) and cost None.
    """
    problem = prepare(graph)
    available = families(problem)
    names = methods or ["exact", *available, *BUDGETED]
    unknown = set(names) - {"exact", *available, *BUDGETED}
    if unknown:
        raise ValueError(f"unknown or inapplicable methods {sorted(unknown)}")
    chosen = {name: available[name] for name in names if name in available}
    points = []
    for raw in budgets:
        budget = parse_budget(raw, problem)
        if "exact" in names:
            try:
                s = solve(graph, budget, time_limit=time_limit, workers=workers)
                points.append(
                    FrontierPoint("exact", budget, s.cost, s.peak, s.status, s.gap, s.solve_seconds)
                )
            except InfeasibleBudgetError:
                points.append(FrontierPoint("exact", budget, None, None, "INFEASIBLE", None, 0.0))
            except SolverTimeoutError:
                points.append(FrontierPoint("exact", budget, None, None, "TIMEOUT", None, 0.0))
        heuristics = dict(chosen)
        for name, runs in BUDGETED.items():
            if name in names:
                heuristics[name] = runs(problem, budget)
        for name, members in heuristics.items():
            best = cheapest_within(members, budget)
            if best is None:
                points.append(FrontierPoint(name, budget, None, None, "NO FIT", None, 0.0))
            else:
                points.append(
                    FrontierPoint(
                        name, budget, best.schedule.cost, best.schedule.peak, "FEASIBLE", None, 0.0
                    )
                )
    return points
